# rcpflow: `make test` and `make demo` each set up .venv from a fresh clone first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# Local runs are CPU-only; name the platform so JAX does not probe for accelerators.
export JAX_PLATFORMS ?= cpu

.PHONY: setup test test-fast demo bench lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[all]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest

# The suite without the slow end-to-end tests (CI runs everything).
test-fast: setup
	$(PY) -m pytest -m "not slow"

demo: setup
	$(PY) -m tasks.demo

bench: setup
	$(PY) -m tpu_jobs.devtools.bench

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
