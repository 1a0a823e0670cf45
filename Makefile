# `make serve` and `make test` work on a fresh machine: each sets up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0
# Ingress replicas serve HTTP themselves, without Serve's proxy actor in the path:
# 1.3x the proxy's streamed tokens/s in bench.stack (see README). 0 for the classic proxy.
export RAY_SERVE_ENABLE_DIRECT_INGRESS ?= 1

.PHONY: install serve test bench clean

install: $(STAMP)

# Reinstall when the dependency list changes; otherwise nothing to do.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/serve run serve_app/configs/demo.yaml

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench.hotpath

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
