# The two set-up commands of the README: `make serve` and `make test`. Everything else is optional.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test lint typecheck pytest openapi validate validate-install report bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Install, migrate the embedded SQLite database (./trainplan.db) and serve on $(HOST):$(PORT).
serve: install
	$(VENV)/bin/alembic upgrade head
	$(VENV)/bin/uvicorn service.main:create_app --factory --host $(HOST) --port $(PORT)

## Install and run the whole test suite: lint, types, tests.
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

## Validation against real transformers models (installs torch 2.13.0 CPU + transformers).
$(VENV)/.validation-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,validation]'
	touch $@

validate-install: $(VENV)/.validation-installed

validate: validate-install
	$(PY) -m validation.run --ci

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache trainplan.db*
