# Thin aliases. With no DATABASE_URL / REDIS_URL everything runs on the embedded default.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo run test faults fuzz lint bench load evaluate install install-torch

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,agent]'
	touch $@

# torch only where a training loop runs: the reporter's tests, the DDP jobs of `make evaluate`,
# the agent-overhead bench and mypy over opsboard_agent.torchcheck; never for `make demo` /
# `make run`. The CPU build: a wheel this machine keeps (pip's find-links) is taken as it is,
# its dependencies from the index; else, on Linux, PyTorch's CPU index (the default index
# would bring the CUDA build and its NVIDIA wheels, several GB); elsewhere PyPI's, CPU-only.
TORCH := torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
$(VENV)/.installed-torch: $(VENV)/.installed
	if $(PY) -m pip install -q --no-index --no-deps '$(TORCH)' 2>/dev/null; then \
	  $(PY) -m pip install -q '$(TORCH)'; \
	elif [ "$$(uname -s)" = Linux ]; then \
	  $(PY) -m pip install -q --index-url $(TORCH_CPU_INDEX) '$(TORCH)'; \
	else \
	  $(PY) -m pip install -q '$(TORCH)'; \
	fi
	touch $@

install: $(VENV)/.installed
install-torch: $(VENV)/.installed-torch

demo: install
	$(PY) -m launcher.stack demo

run: install
	$(PY) -m launcher.stack run

# A browser for the page tests (found, else installed: launcher/browser.py), the static
# files, the suite; then it stops the embedded servers that it started, whichever step
# started them, and leaves running those it found running (launcher/testrun.py).
test: install-torch
	$(PY) -m launcher.testrun $(PYTEST_ARGS)

# The fault suite (docs/faults.md), apart from `make test` (pyproject's addopts deselect it):
# worker and beat killed, Redis stopped and wiped, every batch replayed, each with exact row
# counts, over a 1,000,000-sample ingest (FAULTS_SAMPLES=100000 for a quicker pass). Run, and
# its figures quoted, before every release. Same embedded-server handling as `make test`.
FAULTS_ARGS ?=
faults: install-torch
	$(PY) -m launcher.testrun tests/faults -m faults -s $(FAULTS_ARGS)

# Schemathesis over /api/v1/openapi.json: every operation as every identity (agent tokens,
# viewer, operator, admin, anonymous), no server error, no schema break, no foreign object
# (tests/api/test_schemathesis.py), and walks of the schema's links as each of them
# (tests/api/test_schemathesis_links.py; docs/security.md). Minutes of CPU: apart from `make test`.
FUZZ_ARGS ?=
fuzz: install-torch
	$(PY) -m launcher.testrun tests/api/test_schemathesis.py tests/api/test_schemathesis_links.py \
	  -m fuzz $(FUZZ_ARGS)

lint: install-torch
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/mypy

# Every simulated fault × 3 seeds at two noise levels (CV 10 % and 30 %, spikes on), a
# 2-hour clean run per level, the DDP jobs and the straggler sensitivity table, through a
# live stack, replayed and scored: recall, false alarms, time to detect, culprit, and
# make demo's first ten minutes, fresh and restarted (docs/evaluation.md).
# EVALUATE_ARGS="--fault straggler --noise 0.3" for a part of it.
EVALUATE_ARGS ?= --sensitivity --demo
evaluate: install-torch
	$(PY) manage.py evaluate_detectors $(EVALUATE_ARGS)

bench: install-torch
	$(PY) bench/ingest.py                 # as fast as the server answers
	$(PY) bench/ingest.py --rate 150000   # paced at the target: flat backlog, lag at that rate
	$(PY) bench/detectors.py
	$(PY) bench/kept_window.py           # a live pass from Postgres: cold beside kept
	$(PY) bench/agent_overhead.py
	$(PY) bench/sdc_check.py              # corruption checks at 0.1, 1 and 4 B params, old and new
	$(PY) bench/pages.py                  # pages, charts and history selectors over a 72 h run
	$(PY) bench/commands.py               # 1,000 held long-polls: ingest drop, delivery p99

# Mixed load through locust (issue 25; docs/performance.md, "Mixed load"): 1,000 agents
# posting at 1 Hz, 1,000 held command long-polls and 50 browsers on the pages for 10 min;
# a latency table per request kind, the inbox backlog and lost samples (0). A smaller size:
# LOAD_ARGS="--agents 200 --longpolls 200 --browsers 10 --minutes 2".
LOAD_ARGS ?=
load: install-torch
	$(PY) bench/mixed.py $(LOAD_ARGS)
