# Thin wrapper: everything real lives in pyproject.toml, infra/ and tests/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.llmload-installed
PYTEST_ARGS ?=

.PHONY: setup test test-min lint format demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml infra/setup_system.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	bash infra/setup_system.sh
	@touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -m "not slow and not engine" $(PYTEST_ARGS)

# Unit tests against the lowest dependency versions pyproject.toml allows.
test-min:
	@test -x .venv-min/bin/python || $(PYTHON) -m venv .venv-min
	.venv-min/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-min.txt
	.venv-min/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	.venv-min/bin/python -m pytest -p no:cacheprovider tests/unit -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

demo: setup
	$(BIN)/llmload demo

bench: setup
	$(BIN)/python bench/bench_metrics.py

clean:
	rm -rf $(VENV) .venv-min .pytest_cache .mypy_cache .ruff_cache *.egg-info
