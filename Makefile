# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv and install the project (editable, all extras) if needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL ?= 2
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

# The second environment of the tested matrix: a Python >= 3.12 (found by
# .ci/newer_python) with the newest JAX the pins allow (0.12 today).
MATRIX_VENV  := .venv-newest
MATRIX_PY    := $(MATRIX_VENV)/bin/python
MATRIX_STAMP := $(MATRIX_VENV)/.installed

.PHONY: install demo test test-fast test-matrix lint format fuzz bench bench-matrix clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[jax,tf,dev]"
	touch $(STAMP)

install: $(STAMP)

$(MATRIX_STAMP): setup.cfg pyproject.toml
	test -x $(MATRIX_PY) || "$$(.ci/newer_python)" -m venv $(MATRIX_VENV)
	$(MATRIX_PY) -m pip install --quiet --upgrade pip
	$(MATRIX_PY) -m pip install --quiet -e ".[jax,tf,dev]"
	touch $(MATRIX_STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

# the same suite on the other end of the supported JAX range (CI runs both)
test-matrix: $(MATRIX_STAMP)
	@$(MATRIX_PY) -c "import sys, jax; print(f'test-matrix: Python {sys.version.split()[0]}, jax {jax.__version__}')"
	$(MATRIX_PY) -m pytest -q -n 2 tests

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
	HLO_GUARD_TF_FUZZ_EXAMPLES=300 $(PY) -m pytest -q tests/test_tf_fuzz.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# the benchmarks on the newest JAX (RESULTS.md keeps one generated block per JAX line)
bench-matrix: $(MATRIX_STAMP)
	$(MATRIX_PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(MATRIX_VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
