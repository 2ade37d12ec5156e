# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv and install the project (editable, all extras) if needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: install demo test test-fast lint format fuzz bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[jax,tf,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -x tests -m "not slow"

# ruff (lint + format check) and mypy; CI runs this before the tests
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

fuzz: $(STAMP)
	HLO_GUARD_FUZZ_EXAMPLES=2000 $(PY) -m pytest -q tests/test_fuzz.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
