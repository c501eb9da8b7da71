# The two set-up commands of the README: `make demo` and `make test`. Each creates the virtualenv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test check venv

$(BIN)/outbox: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/outbox

venv: $(BIN)/outbox

demo: venv
	$(BIN)/outbox demo

check: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict outbox flows
	$(BIN)/lint-imports

test: check
	$(BIN)/pytest
