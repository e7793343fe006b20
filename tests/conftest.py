import os

os.environ.setdefault("WANDB_MODE", "disabled")
# Tiny runs take less time than a spawned worker takes to import torch: the suite trains them one after
# another, and tests/analysis/test_parallel.py asks for --jobs itself.
os.environ.setdefault("EMARULE_JOBS", "1")
# The suite's exactness checks (bitwise resume, golden metrics, fp32 references) are CPU checks: on a GPU
# machine cuDNN's kernels are not deterministic and TF32 rounds matmuls. Tests with a CUDA variant ask for
# the GPU themselves (tests/engine/test_cuda.py); subprocesses inherit this.
os.environ.setdefault("EMARULE_DEVICE", "cpu")
# Under pytest-xdist (`make test`) each worker is one of several processes on the cores: one torch thread
# each, as `emarule reproduce` gives its workers, so they do not oversubscribe them. Tests that measure
# threads set their own count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Hypothesis's default 200 ms deadline per example measures the machine, not the maths: on 2 loaded cores
# a first example that imports numpy can take longer, and the test then fails for no fault of the code.
from hypothesis import settings  # noqa: E402

settings.register_profile("emarule", deadline=None)
settings.load_profile("emarule")
