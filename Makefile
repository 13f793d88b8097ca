# The two set-up commands of the README: `make demo` and `make test`. Each creates what it needs.
# The tests are in tiers, by folder (tests/conftest.py): `make test-unit` runs tests/unit/ alone (pure, seconds:
# no lint), `make test` the lint, then the unit and the integration tier (tests/integration/), `make test-e2e`
# the end-to-end tier (tests/e2e/: torchrun jobs, network namespaces, Slurm). CI (.ci/run) runs every tier.
# `make mutation` (slow, not part of `make test`) scores the pure core's tests by mutation testing.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-unit test-integration test-e2e lint docs bench mutation

$(BIN)/ftrain: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,train,experiments,trackers]'
	touch $@

demo: $(BIN)/ftrain
	$(BIN)/ftrain demo

# `TIER_TIMES=FILE make …` appends `<tier> <seconds>` to FILE as each tier ends, passed or not: .ci/run prints
# them against their budgets.
timed = @start=$$(date +%s); $(2); code=$$?; \
	[ -z "$$TIER_TIMES" ] || echo "$(1) $$(($$(date +%s) - start))" >> "$$TIER_TIMES"; exit $$code

lint: $(BIN)/ftrain
	$(call timed,lint,$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy && $(BIN)/lint-imports \
		&& $(MAKE) --no-print-directory docs)

# The docs site, strict: a broken link or anchor, or a page missing from the nav, fails the build.
docs: $(BIN)/ftrain
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint test-unit test-integration

# The unit and integration tiers run on both cores (pytest-xdist; faster than serial on this 2-core machine,
# docs/benchmarks.md) and in a new random order each run (pytest-randomly prints the seed; `--randomly-seed=N`
# replays an order: docs/architecture.md). The e2e tier runs on both cores too, in file order, by groups: a
# module's tests on one worker, the Slurm tests on one, the namespace-cluster tests on one (tests/e2e/conftest.py);
# then the tests marked `alone`, with the machine to themselves.
test-unit: $(BIN)/ftrain
	$(call timed,unit,$(BIN)/pytest -q --durations=5 -n 2 tests/unit)

test-integration: $(BIN)/ftrain
	$(call timed,integration,$(BIN)/pytest -q --durations=15 -n 2 tests/integration)

test-e2e: $(BIN)/ftrain
	$(call timed,e2e,$(BIN)/pytest -q -p no:randomly --durations=15 -n 2 --dist loadgroup --no-loadscope-reorder \
		-m 'not alone' tests/e2e; first=$$?; $(BIN)/pytest -q -p no:randomly --durations=5 -m alone tests/e2e && (exit $$first))

bench: $(BIN)/ftrain
	$(BIN)/python scripts/bench_events.py
	$(BIN)/python scripts/bench_checkpoint.py
	$(BIN)/python scripts/bench_s3.py

mutation: $(BIN)/ftrain
	$(BIN)/python scripts/mutation.py
