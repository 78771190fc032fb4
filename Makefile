# perflab: `make run` runs the default workload, `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $(STAMP)

$(DEV_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP) $(DEV_STAMP)

run: $(STAMP)
	$(BIN)/perflab run

# The suite in parallel, one pytest-xdist worker per core (at most 4), each pinned to its core (tests/conftest.py);
# then the tests that need every core, alone.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))")

test: $(DEV_STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not whole_machine"
	$(BIN)/python -m pytest -m whole_machine

clean:
	rm -rf $(VENV) runs build *.egg-info
