# watchpump: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The project-local PostgreSQL clusters (target/pg*). `make run`'s is on a
# well-known port; the others' ports are derived from the checkout's path,
# so that two checkouts can run `make test` at once. `make ports` prints
# them; PG_TEST_PORT=... and the like override them.
PORT_BASE := $(shell printf '%s' "$(CURDIR)" | cksum | awk '{print 55000 + ($$1 % 1000) * 4}')
PG_RUN_PORT  ?= 54329
PG_TEST_PORT ?= $(PORT_BASE)
PG_BENCH_PORT ?= $(shell echo $$(($(PORT_BASE) + 1)))
PG_CHAOS_PORT ?= $(shell echo $$(($(PORT_BASE) + 2)))
CHANGES ?= 20000
NEXTEST := $(shell cargo nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: help build run demo test chaos bench lint fmt ports pg-stop

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

build: ## build the release binary
	cargo build --release

run: ## run the pump and API (starts a project-local PostgreSQL when DATABASE_URL is unset)
	@set -euo pipefail; \
	if [ -z "$${DATABASE_URL:-}" ]; then \
	  admin=$$(scripts/dev-postgres.sh start pg $(PG_RUN_PORT) on | tail -1); \
	  psql "$$admin" -qtAc "select 1 from pg_database where datname = 'watchpump'" | grep -q 1 \
	    || psql "$$admin" -qc "create database watchpump"; \
	  export DATABASE_URL="$${admin%/postgres}/watchpump"; \
	  echo "DATABASE_URL=$$DATABASE_URL (project-local cluster in target/pg; 'make pg-stop' stops it)"; \
	fi; \
	export WATCHPUMP_PRODUCER="$${WATCHPUMP_PRODUCER:-git}"; \
	export WATCHPUMP_PRODUCER_TOKEN="$${WATCHPUMP_PRODUCER_TOKEN:-dev-producer-token}"; \
	export WATCHPUMP_ALLOWED_DESTINATIONS="$${WATCHPUMP_ALLOWED_DESTINATIONS-127.0.0.0/8,::1}"; \
	echo "building watchpump in release mode (the first build takes a few minutes)"; \
	cargo build --release; \
	target/release/watchpump migrate; \
	exec target/release/watchpump serve

demo: ## one minute of watchpump: a pump, a consumer and a producer in this terminal
	@scripts/demo.sh $(PG_RUN_PORT)

test: ## start a throwaway PostgreSQL and run every test
	@set -euo pipefail; \
	url=$$(scripts/dev-postgres.sh start pg-test $(PG_TEST_PORT) off | tail -1); \
	echo "test cluster: target/pg-test on port $(PG_TEST_PORT), the chaos test's on $(PG_CHAOS_PORT) (they keep running; make pg-stop stops them)"; \
	scripts/test-deps.sh; \
	psql "$$url" -qtAc "select 'drop database \"' || datname || '\";' from pg_database where datname like 'wp\_t\_%'" | psql "$$url" -q >/dev/null; \
	export WATCHPUMP_TEST_DATABASE_URL="$$url" WATCHPUMP_CHAOS_PG_PORT=$(PG_CHAOS_PORT); \
	if [ "$(NEXTEST)" = yes ]; then cargo nextest run --no-fail-fast; else cargo test --no-fail-fast; fi

chaos: ## the chaos suite: pumps killed, PostgreSQL restarted, consumers failing (CHANGES=100000 for more)
	@set -euo pipefail; \
	export WATCHPUMP_CHAOS_CHANGES=$(CHANGES) WATCHPUMP_CHAOS_PG_PORT=$(PG_CHAOS_PORT); \
	cargo test --release --test chaos -- --ignored --exact chaos --nocapture 2>&1 | grep -v '^$$'

bench: ## build in release mode and run the benchmarks (SCENARIOS="trickle bulk" for a subset)
	@set -euo pipefail; \
	url=$$(scripts/dev-postgres.sh start pg-bench $(PG_BENCH_PORT) on | tail -1); \
	cargo build --release --quiet --bin watchpump --example bench; \
	WATCHPUMP_BENCH_DATABASE_URL="$$url" target/release/examples/bench $(SCENARIOS)

lint: ## rustfmt and clippy, as CI wants them; the consumer kit builds without the pump's dependencies
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --no-default-features --features kit -- -D warnings
	@if cargo tree --no-default-features --features kit -e normal | grep -E 'reqwest|clap|metrics'; then \
	  echo "the kit feature pulls in a producer-only dependency (above)"; exit 1; fi

fmt: ## format the code
	cargo fmt --all

ports: ## print the project-local clusters' ports
	@echo "run $(PG_RUN_PORT), test $(PG_TEST_PORT), bench $(PG_BENCH_PORT), chaos $(PG_CHAOS_PORT)"

pg-stop: ## stop the project-local PostgreSQL clusters
	scripts/dev-postgres.sh stop pg
	scripts/dev-postgres.sh stop pg-test
	scripts/dev-postgres.sh stop pg-bench
	scripts/dev-postgres.sh stop pg-chaos
