# Two entry points on a fresh machine: `make run` (the main job) and `make test` (the suite).
# Both create or reuse the project's virtual environment at .venv and install unmask into it.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
ONNX_FLAVOUR ?= cpu

.PHONY: setup run demo test test-fast browser-deps clean-state

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(ONNX_FLAVOUR),dev]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/unmask run

demo: run

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not browser"

clean-state:
	rm -rf .unmask
