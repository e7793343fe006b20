# Two commands set up a fresh machine: `make run` and `make test`. Both create .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision first, from the pinned releases (on this machine they install from local disk).
TORCH := torch==2.14.1 torchvision==0.29.1
export WANDB_MODE ?= disabled

.PHONY: run test bench lint venv clean repro

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 2>/dev/null || true
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev,lightning,hf]'
	touch $(STAMP)

venv: $(STAMP)

PARABOLA_OUT := runs/parabola/paper

run: $(STAMP)
	$(BIN)/emarule plan byol-vit --kappa 6
	$(BIN)/emarule table momenta
	$(BIN)/emarule run parabola --preset paper --out $(PARABOLA_OUT)
	@echo "noisy parabola (§3.1, App. E.1): figures in $(PARABOLA_OUT)/figures/, table in $(PARABOLA_OUT)/table.txt,"
	@echo "  records in $(PARABOLA_OUT)/results.json, method and wall time in $(PARABOLA_OUT)/run.json"

test: $(STAMP)
	$(BIN)/python -m pytest

# Every family's `emarule reproduce` with its defaults (cpu presets, 5 seeds, each family's arms), one after
# another, into runs/reproduce/<family>/ (report.md, verdict.json, figures/). Not part of CI.
# A family whose task cannot run yet prints its one-line reason and the next one starts.
REPRO_FAMILIES := parabola precision byol byol-vit byol-r50-lars polyak dino ctc-polyak ctc-pseudo-label

repro: $(STAMP)
	@for f in $(REPRO_FAMILIES); do $(BIN)/emarule reproduce $$f || echo "make repro: $$f did not complete"; done

# Each prints its measured ratio; BENCH_ARGS=--quick for a smoke test of all four (seconds).
# The loop benchmark pins torch to 1 thread for both loops; OMP_NUM_THREADS=1 keeps the parabola's BLAS alike.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/loop_overhead.py $(BENCH_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/parabola_speed.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/startup.py $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check emarule tests benchmarks examples

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
