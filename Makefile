# The README's two commands:
#   make demo   set up .venv and run the main job on the embedded default (local backend)
#   make test   set up .venv, lint, type-check, and run the whole suite on a real 2-node Slurm
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Pinned for this repo's own dev/CI installs: these resolve offline from the machine's wheel
# cache. Users installing hpc-ddp get the ranges in pyproject.toml instead.
PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: venv demo test lint unit cluster-up cluster-down bench clean

$(BIN)/hpc-ddp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(PINS) -e '.[dev,plot]'
	@touch $@

venv: $(BIN)/hpc-ddp

demo: venv
	$(BIN)/hpc-ddp submit jobs/quickstart.yaml --backend local --wait

lint: venv
	$(BIN)/ruff check hpc_ddp tests benchmarks
	$(BIN)/ruff format --check hpc_ddp tests benchmarks
	$(BIN)/mypy

# The Slurm suite brings the dev clusters up itself (tests/conftest.py) and takes them down
# after. Most real-Slurm tests wait on Slurm's clock, not the CPU, so the suite runs on two
# workers per core (at most 8), each with clusters of its own; TEST_WORKERS=0 runs it serially.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n * 2 < 8 ? n * 2 : 8 )))

# Bytecode first: every rank and CLI process of the suite imports hpc-ddp, and with
# PYTHONDONTWRITEBYTECODE set (as on CI's machine) each would compile it again (0.2 s of CPU).
test: venv lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q hpc_ddp tests benchmarks
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup

unit: venv
	$(BIN)/pytest -q -m "not slurm"

# Every benchmark against its targets (exit 1 if one is missed); QUICK=1 for the quickest mode.
bench: venv
	$(BIN)/python benchmarks/run_all.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
