# Thin aliases. With no DATABASE_URL / REDIS_URL everything runs on the embedded default.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo run test lint bench evaluate install install-torch

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,agent]'
	touch $@

# torch (~1.5 GB) only where a training loop runs: the reporter's tests, the DDP jobs of
# `make evaluate`, the agent-overhead bench and mypy over opsboard_agent.torchcheck; never
# for `make demo` / `make run` (this pin is the CPU build these machines carry).
$(VENV)/.installed-torch: $(VENV)/.installed
	$(PY) -m pip install -q 'torch==2.13.0'
	touch $@

install: $(VENV)/.installed
install-torch: $(VENV)/.installed-torch

demo: install
	$(PY) -m launcher.stack demo

run: install
	$(PY) -m launcher.stack run

# Tests serve plain HTTP on loopback: no HTTPS redirect or secure-only cookies there.
TEST_ENV := SECURE_SSL_REDIRECT=false SESSION_COOKIE_SECURE=false CSRF_COOKIE_SECURE=false

test: install-torch
	$(PY) manage.py collectstatic --noinput -v 0
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS)

lint: install-torch
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/mypy

# Every simulated fault × 3 seeds at two noise levels (CV 10 % and 30 %, spikes on), a
# 2-hour clean run per level, the DDP jobs and the straggler sensitivity table, through a
# live stack, replayed and scored: recall, false alarms, time to detect, culprit
# (docs/evaluation.md). EVALUATE_ARGS="--fault straggler --noise 0.3" for a part of it.
EVALUATE_ARGS ?= --sensitivity
evaluate: install-torch
	$(PY) manage.py evaluate_detectors $(EVALUATE_ARGS)

bench: install-torch
	$(PY) bench/ingest.py                 # as fast as the server answers
	$(PY) bench/ingest.py --rate 150000   # paced at the target: flat backlog, lag at that rate
	$(PY) bench/detectors.py
	$(PY) bench/agent_overhead.py
	$(PY) bench/pages.py                  # pages, charts and history selectors over a 72 h run
	$(PY) bench/commands.py               # 1,000 held long-polls: ingest drop, delivery p99
