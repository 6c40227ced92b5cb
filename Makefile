# h3flow — `make demo` runs the embedded default end to end, `make test` runs the tests.
# Both create .venv (CPU torch 2.13.0 where no torch is installed) and are idempotent.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.h3flow-installed

.PHONY: venv system-deps demo stop test test-fast lint bench clean

$(STAMP): pyproject.toml setup.py h3flow/planner/_fastseq.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the tests use for real parts (sshd, patch, ip/tc). Needs root; skipped otherwise.
system-deps:
	@bash scripts/install-system-deps.sh

# The services keep running after `make demo`, so the UI link and `h3flow logs` work:
# `make stop` ends them. `make demo KEEP=no` stops them at the end; DEMO_ARGS passes more
# options (e.g. DEMO_ARGS="--database postgresql"; see `.venv/bin/h3flow demo --help`).
KEEP      ?= yes
DEMO_ARGS ?=

demo: venv
	$(VENV)/bin/h3flow demo $(if $(filter yes,$(KEEP)),--keep) $(DEMO_ARGS)

stop: venv
	$(VENV)/bin/h3flow stop --local -c .h3flow/local.json

test: venv system-deps
	$(PY) -m pytest -q

# ruff (lint + format) and mypy, as CI runs them before the tests
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# the quick tier: no Prefect server, no ComfyUI
test-fast: venv
	$(PY) -m pytest -q -m "not prefect and not comfy and not netns and not faults"

bench: venv
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	if [ -f .h3flow/local.json ] && [ -x $(VENV)/bin/h3flow ]; then $(VENV)/bin/h3flow stop --local -c .h3flow/local.json; fi
	rm -rf $(VENV) .h3flow .h3flow-comfy .pytest_cache .hypothesis
