# mvlog: the two commands are `make demo` and `make test`; both run `make setup` first.
#
#   make setup   ready a fresh clone: Debian packages (redis-server, a Java runtime, Maven) when missing,
#                then .venv with mvlog installed in editable mode (strict) with its dev tools, bytecode
#                in pyspark's pyspark.zip (infra/pyspark_bytecode.py), then
#                Apache Kafka's jars from Maven Central (infra/kafka/pom.xml) into ~/.cache/mvlog, and
#                Kafka Connect's + Debezium's PostgreSQL connector's (infra/connect/pom.xml; the CDC test),
#                and Apicurio Registry (infra/registry/pom.xml; the Schema Registry test of Avro sources)
#   make test    setup + lint (ruff, mypy) + the whole pytest suite (integration tests start their
#                own Apache Kafka broker and redis-server on free loopback ports)
#   make demo    setup + the demo
#   make lint    ruff and mypy only
#   make soak    setup + the chaos soak test (tests/integration/test_soak.py; not in `make test`: see README)
#   make bench   the benchmarks (bench/run.py)
#   make bench-peers   the Nexmark peer engines' venvs (~/.cache/mvlog/peers/<engine>/venv: Spark, Quix
#                Streams, Pathway, Flink) and their Kafka connector jars from Maven Central; PEERS="quix spark"
#                for some (several GB in all; bench/nexmark.py also makes them on first use)
#   make up / make down   start / stop the local stack (Apache Kafka + Redis) on mvlog's default ports
#   make purge   stop the local stack and delete its data (.mvlog/kafka, .mvlog/redis)

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

# The first interpreter that is Python >= 3.11 (override: make PYTHON=/path/to/python3.12 ...).
PYTHON ?= $(shell for p in python3 python3.12 python3.11 python3.13; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { command -v $$p; break; }; done)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mvlog-installed
# Strict editable installs link each file at install time: a new module needs a re-install.
PACKAGE_FILES := pyproject.toml $(shell find core connectors services infra schemas -type f \
	\( -name '*.py' -o -name '*.pyx' -o -name '*.pyi' -o -name '*.avsc' -o -name '*.yml' -o -name '*.conf' -o -name '*.html' -o -name '*.js' \
	-o -name '*.css' -o -name '*.lua' \) -not -path '*/__pycache__/*')
TEST_TIMEOUT ?= 600
# The suite mostly waits (brokers, JVM starts, epochs; the load average stayed at 1.5-4 on two cores with
# two workers): three pytest-xdist workers, one test file each at a time. TEST_WORKERS=0 runs it in one
# process.
TEST_WORKERS ?= 3
PYTEST_ARGS ?=

.PHONY: help setup system-deps pyspark-bytecode kafka connect registry lint test soak demo bench bench-peers up down purge clean

help:
	@awk '/^#/ { sub(/^# ?/, ""); print; next } { exit }' Makefile

setup: system-deps $(STAMP) pyspark-bytecode kafka connect registry

# Bytecode beside the sources of pyspark's pyspark.zip, which Spark puts first on its Python workers' path
# (zipimport never caches bytecode: each worker compiled pyspark again, ~0.4 s of CPU; infra/pyspark_bytecode.py).
pyspark-bytecode: $(STAMP)
	@"$(PY)" -m mvlog.infra.pyspark_bytecode

# Apache Kafka's jars (kafka_2.13, its run-time dependencies and a logging binding), resolved from Maven
# Central by mvn into ~/.cache/mvlog/kafka-<version> (MVLOG_KAFKA_HOME), reused when present.
kafka: $(STAMP)
	@"$(PY)" -c 'from mvlog.infra.kafka_broker import ensure_kafka_jars, kafka_home; \
		home = kafka_home(); print(f"Apache Kafka jars: {ensure_kafka_jars(home)}")'

# Kafka Connect (connect-runtime, connect-json: the broker's Kafka version) and Debezium's PostgreSQL
# connector, resolved from Maven Central into ~/.cache/mvlog/connect-<kafka>-debezium-<version>
# (MVLOG_CONNECT_HOME), reused when present: the tests' real CDC pipeline runs them.
connect: $(STAMP)
	@"$(PY)" -c 'from mvlog.infra.kafka_connect import ensure_connect_jars; \
		print(f"Kafka Connect + Debezium jars: {ensure_connect_jars()}")'

# Apicurio Registry (a Schema Registry with Confluent's API; its Quarkus application, published whole on Maven
# Central as a tar.gz), unpacked by mvn into ~/.cache/mvlog/apicurio-registry-<version> (MVLOG_SCHEMA_REGISTRY_HOME),
# reused when present: the tests of Avro sources look their writer schemas up in it.
registry: $(STAMP)
	@"$(PY)" -c 'from mvlog.infra.schema_registry import ensure_registry_app; \
		print(f"Apicurio Registry: {ensure_registry_app()}")'

# Debian packages the stack needs: redis-server (the local stack's Redis), a Java runtime >= 17 (Spark and
# Apache Kafka), maven (resolves Kafka's jars from Maven Central), postgresql (the CDC test's database;
# its initdb and postgres live under /usr/lib/postgresql/<major>/bin),
# python3-venv (only when the interpreter cannot make a venv), chromium and chromium-driver (the
# dashboard's browser test drives Debian's headless Chromium). Installed only when missing.
system-deps:
	@if [ -z "$(PYTHON)" ]; then \
		echo "mvlog needs Python >= 3.11 (python3, python3.12 or python3.11 on PATH)," \
		     "or run: make PYTHON=/path/to/python3.11 $(MAKECMDGOALS)" >&2; exit 1; fi
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	command -v mvn >/dev/null 2>&1 || missing="$$missing maven"; \
	{ command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } \
		|| missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	"$(PYTHON)" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		if ! command -v apt-get >/dev/null 2>&1; then \
			echo "Please install:$$missing (no apt-get here; e.g. brew install redis openjdk@17)" >&2; \
			exit 1; fi; \
		if [ "$$(id -u)" = 0 ]; then sudo=""; \
		elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; \
		else echo "Please install as root: apt-get install -y$$missing" >&2; exit 1; fi; \
		echo "Installing Debian packages:$$missing"; \
		$$sudo apt-get update -qq; \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi
	@java_major=$$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\)[."].*/\1/p' | head -1); \
	if [ -z "$$java_major" ] || [ "$$java_major" -lt 17 ]; then \
		echo "Spark 4 and Apache Kafka 4 need Java >= 17, found: $$(java -version 2>&1 | head -1)." \
		     "Install one, e.g. apt-get install -y openjdk-17-jre-headless" >&2; exit 1; fi

$(STAMP): $(PACKAGE_FILES)
	@if ! "$(PY)" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
		echo "Creating $(VENV) with $(PYTHON)"; rm -rf "$(VENV)"; "$(PYTHON)" -m venv "$(VENV)"; \
		"$(PY)" -m pip install -q --upgrade pip; fi
	@echo "Installing mvlog (editable, strict) and its dev tools into $(VENV)"
	"$(PY)" -m pip install -q -e '.[dev]' --config-settings editable_mode=strict
	@touch "$@"

lint: setup
	$(VENV)/bin/ruff check .
	@# mypy checks the installed package (the mvlog.* names) through the editable link tree, then the
	@# tests; paths in its messages are mapped back to the repository's folders.
	@tree=$$(ls -td build/__editable__.mvlog-* | head -1); \
	echo "mypy -p mvlog (from $$tree)"; \
	(cd "$$tree" && "$(CURDIR)/$(VENV)/bin/mypy" --config-file "$(CURDIR)/pyproject.toml" -p mvlog) \
		| sed -E -e 's#^mvlog/(schemas|connectors|services|infra)/#\1/#' -e 's#^mvlog/#core/#'; \
	echo "mypy tests bench"; \
	MYPYPATH="$$tree" $(VENV)/bin/mypy --explicit-package-bases tests bench

test: setup lint
	@# pytest exits 5 when it collects no test: make fails then, as on any other non-zero exit.
	PYSPARK_PYTHON="$(CURDIR)/$(PY)" PYSPARK_DRIVER_PYTHON="$(CURDIR)/$(PY)" \
		"$(PY)" -m pytest -q --timeout=$(TEST_TIMEOUT) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 $(PYTEST_ARGS)

# The chaos soak (5-15 minutes on two cores): every event at once, beside nothing else.
soak: setup
	MVLOG_TEST_SOAK=1 PYSPARK_PYTHON="$(CURDIR)/$(PY)" PYSPARK_DRIVER_PYTHON="$(CURDIR)/$(PY)" \
		"$(PY)" -m pytest -q -rA tests/integration/test_soak.py $(PYTEST_ARGS)

# The demo reuses the stack of `make up` when it runs, else starts one (and stops it at the end).
# DEMO_ARGS: e.g. make demo DEMO_ARGS="--duration 60".
DEMO_ARGS ?=
demo: setup
	$(VENV)/bin/mvlog demo $(DEMO_ARGS)

bench: setup
	@if [ -f bench/run.py ]; then \
		PYSPARK_PYTHON="$(CURDIR)/$(PY)" "$(PY)" bench/run.py; \
	else echo "No benchmarks yet (bench/run.py)."; fi

# Each peer in a venv of its own (its pins never meet mvlog's), from bench/nexmark_suite/peers/requirements.
PEERS ?=
bench-peers: setup
	"$(PY)" -m bench.nexmark_suite.peers.venvs $(PEERS)

up: setup
	$(VENV)/bin/mvlog up

down:
	@if [ -x $(VENV)/bin/mvlog ]; then $(VENV)/bin/mvlog down; else echo "No $(VENV): nothing to stop."; fi

purge:
	@if [ -x $(VENV)/bin/mvlog ]; then $(VENV)/bin/mvlog down --purge; else rm -rf .mvlog/kafka .mvlog/redis; fi

clean: purge
	rm -rf "$(VENV)" build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis .mvlog
