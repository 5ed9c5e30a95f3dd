# Two entry points on a fresh machine: `make run` (the main job) and `make test` (the suite).
# Both create or reuse the project's virtual environment at .venv and install unmask into it;
# `make test` also installs Debian's chromium for the browser test and postgresql for the team-registry tests
# when they are missing.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
ONNX_FLAVOUR ?= cpu
# tests/e2e/test_dashboard_browser.py drives this binary (playwright's own browser download cannot
# work offline, Debian's package can come from the distribution mirror).
CHROMIUM := /usr/bin/chromium

.PHONY: setup run demo test test-fast test-unit test-e2e lint format browser-deps postgres-deps clean-state

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(ONNX_FLAVOUR),dev]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/unmask run

demo: setup
	$(VENV)/bin/unmask run --demo

browser-deps:
	@if [ -x $(CHROMIUM) ] && command -v pdftoppm >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "error: $(CHROMIUM) or pdftoppm is missing and make is not running as root to install them." >&2; \
	  echo "The browser tests need Debian's chromium, and the dossier's PDF test poppler-utils; install them with:" >&2; \
	  echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends chromium poppler-utils" >&2; \
	  echo "(or run 'make test-fast', which skips the browser test)" >&2; \
	  exit 1; \
	fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -q && apt-get install -y -q --no-install-recommends chromium poppler-utils

# tests/support/postgres_fixtures.py runs initdb/pg_ctl from Debian's postgresql (a throwaway cluster on 127.0.0.1).
postgres-deps:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "error: PostgreSQL (initdb, pg_ctl) is missing and make is not running as root to install it." >&2; \
	  echo "The team-registry tests start a throwaway PostgreSQL; install it with:" >&2; \
	  echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends postgresql" >&2; \
	  echo "(or run 'make test-fast', which starts no server)" >&2; \
	  exit 1; \
	fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -q && apt-get install -y -q --no-install-recommends postgresql

# The tiers are folders (tests/conftest.py): unit, integration, e2e. A module's tests stay on one worker (--dist
# loadfile), so a module-scoped server or registry is built once. The unit and integration tiers keep every core busy:
# one worker per core. The e2e tier waits (servers starting, rollout intervals, clusters): with one worker per core
# the CPUs sat 13-14 % idle through `make test`, so it runs one worker more than the cores. The whole suite on 2 cores
# (issue 50), runs interleaved on one host from 07:25 to 08:22 on 2026-12-07: 3 workers 829.5 s, 2 workers 862.4 s,
# 3 workers 822.6 s, 2 workers 859.0 s (idle 1.7-1.9 % with 3, 13.4-14.4 % with 2). WORKERS=N still chooses.
# The cores this process may run on: nproc would answer OMP_NUM_THREADS instead when that is set.
CORES := $(shell env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
E2E_WORKERS := $(shell expr $(CORES) + 1)
PYTEST = $(PY) -m pytest -q -n $(or $(WORKERS),$(1)) --dist loadfile

test: setup browser-deps postgres-deps
	$(call PYTEST,$(E2E_WORKERS)) tests

test-fast: setup
	$(call PYTEST,auto) tests/unit tests/integration

test-unit: setup
	$(call PYTEST,auto) tests/unit

test-e2e: setup browser-deps postgres-deps
	$(call PYTEST,$(E2E_WORKERS)) tests/e2e

# Lint and types, as CI runs them before the tests (.pre-commit-config.yaml runs the same on a commit).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean-state:
	rm -rf .unmask
