# Two commands set up a fresh machine: `make run` and `make test`. Both create .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch and torchvision first, from the pinned releases (on this machine they install from local disk).
TORCH := torch==2.14.1 torchvision==0.29.1
export WANDB_MODE ?= disabled

.PHONY: run test bench lint venv clean repro rejudge

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 2>/dev/null || true
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[all,dev,lightning,hf]'
	touch $(STAMP)

venv: $(STAMP)

PARABOLA_OUT := runs/parabola/paper

run: $(STAMP)
	$(BIN)/emarule plan byol-vit --kappa 6
	$(BIN)/emarule table momenta
	$(BIN)/emarule run parabola --preset paper --out $(PARABOLA_OUT)
	@echo "noisy parabola (§3.1, App. E.1): figures in $(PARABOLA_OUT)/figures/, table in $(PARABOLA_OUT)/table.txt,"
	@echo "  records in $(PARABOLA_OUT)/results.json, method and wall time in $(PARABOLA_OUT)/run.json"

# The suite in TEST_JOBS worker processes (pytest-xdist), a test file to a worker: most tests train a tiny
# run on one thread, so two workers keep 2 cores busy. `make test TEST_JOBS=0` runs it in one process.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile

# Every claim, judged at CPU scale: each family's `emarule reproduce` with its defaults (cpu presets, seeds
# 0-4, every κ and arm) into runs/reproduce/<family>/, each training family followed by its headline claim again
# on seeds 100-104 (`--headline`: only the runs that claim reads) into runs/reproduce/<family>-headline/; last,
# the README's table of claims, each family page's results block and the README's figures (docs/figures/) are
# rewritten from their verdict.json files and figures, with the wall time of it all.
# A stopped root thus holds whole families. Finished runs are kept: stopped, the same command resumes; runs kept
# as their records alone (results/cpu-root/*.tgz extracted here) are judged from those and do not train again.
# Before each family a line says where it is: `make repro: [3/9] polyak, 2 min in`.
# `make rejudge`: the same root judged again when only the analysis changed, training nothing: the training
# families with `--judge-only` (their runs' records suffice, checkpoints or not), the studies reusing their
# results.json (computed, a minute or two, where it is missing); then the same rewrite, without a wall time of
# its own.
# Not part of CI; the wall times are under the README's table.
REPRO_OUT := runs/reproduce
REPRO_SEEDS_NEW := 100-104
JUDGE :=

define REPRO_ALL
	@start=$$(date +%s); \
	families=$$($(BIN)/python -c 'from emarule.analysis.reproduce.claims import FAMILIES; print(*(f"{n}:{f.kind}" for n, f in FAMILIES.items()))'); \
	n=$$(echo $$families | wc -w); i=0; \
	for fk in $$families; do f=$${fk%%:*}; i=$$((i + 1)); \
	  echo "make $@: [$$i/$$n] $$f, $$(( ($$(date +%s) - start) / 60 )) min in"; \
	  if [ "$${fk#*:}" = sweep ]; then judge="$(JUDGE)"; else judge=""; fi; \
	  $(BIN)/emarule reproduce $$f --out $(REPRO_OUT)/$$f $$judge || echo "make $@: $$f did not complete"; \
	  if [ "$${fk#*:}" = sweep ]; then $(BIN)/emarule reproduce $$f --headline --seeds $(REPRO_SEEDS_NEW) \
	    --out $(REPRO_OUT)/$$f-headline $$judge || echo "make $@: $$f --headline did not complete"; fi; done; \
	$(BIN)/python -m emarule.analysis.reproduce.table $(REPRO_OUT) --readme README.md --pages emarule/experiments \
	  --figures docs/figures $(if $(JUDGE),,--wall-s $$(( $$(date +%s) - start ))) \
	  && echo "make $@: README.md's table of claims, the family pages' results and docs/figures rewritten from $(REPRO_OUT)"
endef

repro: $(STAMP)
	$(REPRO_ALL)

rejudge: JUDGE := --judge-only
rejudge: $(STAMP)
	$(REPRO_ALL)

# Each prints its measured ratio; BENCH_ARGS=--quick for a smoke test of all six (seconds).
# The loop benchmark pins torch to 1 thread for both loops; OMP_NUM_THREADS=1 keeps the parabola's BLAS alike.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/loop_overhead.py $(BENCH_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/parabola_speed.py $(BENCH_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/augment_speed.py $(BENCH_ARGS)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/memory_format.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/startup.py $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check emarule tests benchmarks examples

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
