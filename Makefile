# Thin aliases. With no DATABASE_URL / REDIS_URL everything runs on the embedded default.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo run test lint bench install

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,agent]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m opsboard.stack demo

run: install
	$(PY) -m opsboard.stack run

test: install
	$(PY) manage.py collectstatic --noinput -v 0
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run

bench: install
	$(PY) bench/ingest.py
