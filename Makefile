# watchpump: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The project-local PostgreSQL clusters (target/pg*). `make run`'s is on a
# well-known port; the others get a free port chosen once per checkout and
# remembered in target/pg-*.port (scripts/dev-postgres.sh), so that two
# checkouts can run `make test` at once. `make ports` prints them;
# PG_TEST_PORT=... and the like override them.
PG_RUN_PORT  ?= 54329
PG_TEST_PORT ?= $(shell scripts/dev-postgres.sh port pg-test)
PG_BENCH_PORT ?= $(shell scripts/dev-postgres.sh port pg-bench)
PG_CHAOS_PORT ?= $(shell scripts/dev-postgres.sh port pg-chaos)
CHANGES ?= 20000
# make chaos FAULTS=failover: instead of restarts, a Patroni cluster (etcd,
# two PostgreSQL nodes, HAProxy asking Patroni which is the primary) has its
# primary switched over, crashed and cut off from etcd under load; SYNC=off
# without Patroni's synchronous_mode (lost commits are then counted, not a
# failure). Patroni and etcd are Debian's, unpacked into target/tools.
FAULTS ?=
SYNC ?= on
NEXTEST := $(shell cargo nextest --version >/dev/null 2>&1 && echo yes)

.PHONY: help build run examples demo test chaos bench lint fmt ports pg-stop

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
	[ -s target/dev-secret-key ] || (mkdir -p target; umask 077; head -c 32 /dev/urandom | base64 > target/dev-secret-key); \
	export WATCHPUMP_SECRET_KEY="$${WATCHPUMP_SECRET_KEY:-$$(cat target/dev-secret-key)}"; \
	[ -s target/dev-admin-token ] || (mkdir -p target; umask 077; od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >target/dev-admin-token); \
	export WATCHPUMP_ADMIN_TOKEN="$${WATCHPUMP_ADMIN_TOKEN:-$$(cat target/dev-admin-token)}"; \
	echo "building watchpump in release mode (the first build takes 4-9 minutes on 2 cores)"; \
	CARGO_TERM_PROGRESS_WHEN=always CARGO_TERM_PROGRESS_WIDTH=80 cargo build --release; \
	target/release/watchpump migrate; \
	target/release/watchpump kinds add --file kinds/git.json >/dev/null; \
	echo "panel: http://$${WATCHPUMP_LISTEN:-127.0.0.1:8080}/panel, log in with the token in target/dev-admin-token"; \
	exec target/release/watchpump serve

examples: ## build the ADR's three example consumers in release mode (run each with `make run` running)
	cargo build --release --example deploy --example preview --example docs_draft
	@echo "run them with: target/release/examples/deploy, target/release/examples/preview, target/release/examples/docs_draft"

demo: ## a quarter-minute of watchpump: a pump, a consumer and a producer in this terminal
	@scripts/demo.sh $(PG_RUN_PORT)

test: ## start a throwaway PostgreSQL and run every test
	@set -euo pipefail; \
	url=$$(scripts/dev-postgres.sh start pg-test $(PG_TEST_PORT) off | tail -1); \
	echo "test cluster: target/pg-test on port $(PG_TEST_PORT), the chaos test's on $(PG_CHAOS_PORT) (they keep running; make pg-stop stops them)"; \
	scripts/test-deps.sh; \
	psql "$$url" -qtAc "select 'drop database \"' || datname || '\";' from pg_database where datname like 'wp\_t\_%'" | psql "$$url" -q >/dev/null; \
	export WATCHPUMP_TEST_DATABASE_URL="$$url" WATCHPUMP_CHAOS_PG_PORT=$(PG_CHAOS_PORT); \
	if [ "$(NEXTEST)" = yes ]; then cargo nextest run --no-fail-fast; else cargo test --no-fail-fast; fi

chaos: ## the chaos suite: pumps killed, PostgreSQL restarted, consumers failing (CHANGES=100000 for more; FAULTS=failover [SYNC=off])
	@set -euo pipefail; \
	export WATCHPUMP_CHAOS_CHANGES=$(CHANGES) WATCHPUMP_CHAOS_PG_PORT=$(PG_CHAOS_PORT); \
	export WATCHPUMP_CHAOS_FAULTS=$(FAULTS) WATCHPUMP_CHAOS_SYNC=$(SYNC); \
	cargo test --release --test chaos -- --ignored --exact chaos --nocapture 2>&1 | grep -v '^$$'

bench: ## build in release mode and run the benchmarks (SCENARIOS="trickle bulk" for a subset)
	@set -euo pipefail; \
	url=$$(scripts/dev-postgres.sh start pg-bench $(PG_BENCH_PORT) on | tail -1); \
	cargo build --release --quiet --bin watchpump --example bench; \
	WATCHPUMP_BENCH_DATABASE_URL="$$url" target/release/examples/bench $(SCENARIOS)

lint: ## rustfmt, clippy, rustdoc's links and the queries' .sqlx/ descriptions, as CI wants them; the consumer kit builds without the pump's dependencies
	cargo fmt --all -- --check
	scripts/sqlx-prepare.sh --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --no-default-features --features kit -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
	@if cargo tree --no-default-features --features kit -e normal | grep -E 'reqwest|clap|metrics'; then \
	  echo "the kit feature pulls in a producer-only dependency (above)"; exit 1; fi

fmt: ## format the code
	cargo fmt --all

ports: ## print the project-local clusters' ports
	@echo "run $(PG_RUN_PORT), test $(PG_TEST_PORT), bench $(PG_BENCH_PORT), chaos $(PG_CHAOS_PORT)"

pg-stop: ## stop the project-local PostgreSQL clusters (those running)
	@for c in pg pg-test pg-bench pg-chaos; do scripts/dev-postgres.sh stop $$c; done
