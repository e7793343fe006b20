import os

os.environ.setdefault("WANDB_MODE", "disabled")
# Tiny runs take less time than a spawned worker takes to import torch: the suite trains them one after
# another, and tests/analysis/test_parallel.py asks for --jobs itself.
os.environ.setdefault("EMARULE_JOBS", "1")
