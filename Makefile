# The two set-up commands of the README: `make demo` and `make test`. Each creates what it needs.
# `make test` runs the lint and every test but those marked slow; `make test-slow` runs those (CI runs both).
# `make mutation` (slow, not part of `make test`) scores the pure core's tests by mutation testing.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow lint docs bench mutation

$(BIN)/ftrain: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,train,experiments]'
	touch $@

demo: $(BIN)/ftrain
	$(BIN)/ftrain demo

lint: $(BIN)/ftrain
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(MAKE) docs

# The docs site, strict: a broken link or anchor, or a page missing from the nav, fails the build.
docs: $(BIN)/ftrain
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint
	$(BIN)/pytest -q --durations=15 -m "not slow"

test-slow: $(BIN)/ftrain
	$(BIN)/pytest -q --durations=15 -m slow

bench: $(BIN)/ftrain
	$(BIN)/python scripts/bench_events.py
	$(BIN)/python scripts/bench_checkpoint.py
	$(BIN)/python scripts/bench_s3.py

mutation: $(BIN)/ftrain
	$(BIN)/python scripts/mutation.py
