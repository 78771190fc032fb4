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

test: $(DEV_STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs build *.egg-info
