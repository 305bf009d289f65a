#!/bin/bash
# 20,000 emits, then claim() + complete() BATCH at a time (README.md); or
# another pgbench script of this folder (floor.sh: floor.sql).
set -euo pipefail
db=$1; batch=${2:-10}; script=${3:-claim_complete.sql}
here=$(cd "$(dirname "$0")" && pwd)
psql -X -q "$db" -c "select count(watchpump.emit('acme/r/b' || n, 'push', '{\"after\": \"9f2c1e\"}'))
                     from generate_series(1, 20000) n" -c "vacuum analyze watchpump.queue" >/dev/null
/usr/lib/postgresql/15/bin/pgbench -M prepared -n -c 1 -t $((20000 / batch)) -D batch="$batch" \
    -f "$here/$script" "$db" 2>&1 |
    awk -v b="$batch" '/latency average/ { printf "%.1f µs a delivery (batches of %d)\n", $4 * 1000 / b, b }'
