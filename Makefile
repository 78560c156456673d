# Two commands do everything: `make demo` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-fast demo lint format bench soak schema clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two processes, each test file whole in one of them (its module's database and fixtures stay together):
# the suite waits on real servers about half the time, so the second core takes the other half.
TEST_PROCESSES ?= 2
test: $(STAMP) lint
	$(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadfile

# The suite without the soak, the browser, schemathesis and sshd tests, nor the other heavy ones marked slow
# (server restarts, the demo, worker starts): a check in under 3 minutes. `make test` runs them all.
# Three processes: without the heavy tests the suite waits on servers even more (2:55 against 3:17 with two).
FAST_MARKERS := not (soak or browser or schemathesis or sshd or slow)
FAST_PROCESSES ?= 3
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest -n $(FAST_PROCESSES) --dist loadfile -m "$(FAST_MARKERS)"

demo: $(STAMP)
	$(BIN)/python starter.py demo

bench: $(STAMP)
	$(BIN)/python -m bench

# The soak: the real stack, N exports, every fault kind; exit 1 on any violation (see chaos/).
SOAK_ARGS ?= --exports 300 --seed 1
soak: $(STAMP)
	$(BIN)/python -m chaos $(SOAK_ARGS) --report-json $(or $(SOAK_REPORT),/tmp/fenced-soak-report.json)

# db/schema.sql from a freshly migrated database: run it after adding a migration (tests/db/test_schema_file.py).
schema: $(STAMP)
	$(BIN)/python -m db.schema --write

clean:
	rm -rf $(VENV) .pytest_cache
