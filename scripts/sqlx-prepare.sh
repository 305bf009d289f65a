#!/usr/bin/env bash
# The compile-checked queries of `src/db/` (sqlx's `query!` macros) are
# checked at build time against `.sqlx/`, a description of each query that
# is checked in: builds need no database (`SQLX_OFFLINE=true`, set in
# `.cargo/config.toml`). This script makes that description from a
# database built from `sql/` alone, so it never depends on what a
# developer's own database holds:
#
#   scripts/sqlx-prepare.sh          rewrite .sqlx/ (after editing a query or sql/)
#   scripts/sqlx-prepare.sh --check  fail if .sqlx/ is stale (`make lint`)
#
# The database is `wp_sqlx_<checkout>` in the test cluster (target/pg-test,
# or WATCHPUMP_SQLX_ADMIN_URL's), dropped and made again from
# sql/migrations, sql/functions and sql/kit each run; named after the
# checkout's folder so that two checkouts sharing a cluster do not drop
# each other's.
# sqlx-cli (the `cargo sqlx` command) is installed into target/tools on
# first use, the version of sqlx in Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."

check=
[ "${1:-}" = --check ] && check=--check

admin=${WATCHPUMP_SQLX_ADMIN_URL:-}
if [ -z "$admin" ]; then
  port=${PG_TEST_PORT:-$(scripts/dev-postgres.sh port pg-test)}
  admin=$(scripts/dev-postgres.sh start pg-test "$port" off | tail -1)
fi
name=wp_sqlx_$(basename "$PWD" | tr -c 'a-z0-9\n' _)
db="${admin%/postgres}/$name"
psql "$admin" -qc "drop database if exists $name with (force)" -c "create database $name" >/dev/null

# The files in the order build.rs embeds them: each schema's bookkeeping
# table, its migrations, then its functions.
for dir in sql sql/kit; do
  schema=watchpump; [ "$dir" = sql/kit ] && schema=watchpump_inbox
  psql "$db" -qv ON_ERROR_STOP=1 -c "set client_min_messages = warning" \
    -c "create schema if not exists $schema" \
    -c "create table if not exists $schema.schema_migrations (name text primary key, checksum bytea not null, applied_at timestamptz not null default now())" >/dev/null
  for f in "$dir"/migrations/*.sql "$dir"/functions/*.sql; do
    PGOPTIONS='-c client_min_messages=warning' psql "$db" -qv ON_ERROR_STOP=1 -1 -f "$f" >/dev/null
  done
done

version=$(awk '/^name = "sqlx"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
tools=target/tools/sqlx-cli-$version
if [ ! -x "$tools/bin/cargo-sqlx" ]; then
  echo "installing sqlx-cli $version into $tools (once; a few minutes on 2 cores)" >&2
  cargo install --quiet --locked --root "$tools" "sqlx-cli@$version" \
    --no-default-features --features postgres
fi

# Every target and feature, so that the kit's queries and the tests' are
# described too.
PATH="$PWD/$tools/bin:$PATH" DATABASE_URL="$db" SQLX_OFFLINE=false \
  cargo sqlx prepare $check -- --all-targets --all-features
