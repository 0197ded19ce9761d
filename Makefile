# The two set-up commands of the README: `make serve` and `make test`. Everything else is optional.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
HOST ?= 127.0.0.1
PORT ?= 8000
WORKERS ?= 1
DEEPSPEED_VERSION ?= 0.19.8

.PHONY: install serve test lint typecheck pytest openapi readme heavy-install validate report bench invariant-sweep browser-test clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Install, migrate the embedded SQLite database (./trainplan.db) and serve on $(HOST):$(PORT).
## WORKERS=N serves with N processes: set PROMETHEUS_MULTIPROC_DIR too (README), whose counts of
## an earlier run are removed here.
serve: install
	$(PY) -m service.settings
	$(PY) -m service.persistence.schema
	@if [ -n "$$PROMETHEUS_MULTIPROC_DIR" ]; then mkdir -p "$$PROMETHEUS_MULTIPROC_DIR" && rm -f "$$PROMETHEUS_MULTIPROC_DIR"/*.db; fi
	$(VENV)/bin/uvicorn service.main:create_app --factory --no-access-log --host $(HOST) --port $(PORT) --workers $(WORKERS)

## Install and run the whole test suite: lint, types, tests. Tests that need the heavy tools
## (torch, DeepSpeed, ...) skip without them; `make validate` installs those and runs them.
test: install lint typecheck pytest

lint:
	$(VENV)/bin/ruff check service tests validation bench migrations
	$(VENV)/bin/ruff format --check service tests validation bench

typecheck:
	$(VENV)/bin/mypy

pytest:
	$(PY) -m pytest -q

openapi: install
	$(PY) -m service.openapi

## Run the README's examples against a fresh service on a loopback port and rewrite the outputs it
## prints (tests/readme_examples.py); CI fails when one fails or README.md changes.
readme: install
	$(PY) -m tests.readme_examples --write

## PyTorch 2.13.0 (CPU build), transformers, and the launcher tools (DeepSpeed, accelerate, torchtitan).
$(VENV)/.heavy-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[dev,validation,launchers]'
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation 'deepspeed==$(DEEPSPEED_VERSION)'
	touch $@

heavy-install: $(VENV)/.heavy-installed

## The tests that need the heavy tools, then the validation harness (re-measures a CI subset,
## compares every committed measurement and published case with the estimator, writes REPORT.md).
validate: heavy-install
	TRAINPLAN_NO_SKIPS=1 $(PY) -m pytest -q tests/launchers tests/validation
	$(PY) -m validation.run --ci

## Re-measure everything (minutes) and rewrite validation/data/*.json and validation/REPORT.md.
report: heavy-install
	$(PY) -m validation.run --all

## The page in a real browser (Playwright driving Debian's Chromium: apt-get install chromium), skips
## turned into failures; SCREENSHOT=docs/page.png refreshes the README's picture.
browser-test: install
	$(PY) -m pip install -q -e '.[dev,browser]'
	TRAINPLAN_NO_SKIPS=1 TRAINPLAN_SCREENSHOT=$(SCREENSHOT) $(PY) -m pytest -q tests/test_web_page.py

bench: install
	test -f .bench-venv/.installed || { $(PYTHON) -m venv .bench-venv \
		&& .bench-venv/bin/python -m pip install -q 'llm-analysis==0.2.2' && touch .bench-venv/.installed; }
	$(PY) -m bench.recommender_bench --llm-analysis .bench-venv/bin/python --json bench/results.json
	$(PY) -m bench.estimate_latency

## Issue 24's invariants over every preset x every catalog GPU x full/LoRA/QLoRA (2,499 plans, in-process;
## CPU-bound: the infeasible plans' suggestion searches dominate): bench/invariant_sweep.json and a summary.
invariant-sweep: install
	$(PY) -m bench.invariant_sweep

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache trainplan.db*
