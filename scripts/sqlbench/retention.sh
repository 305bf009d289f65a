#!/bin/bash
# One prune() call while pgbench emits one change a transaction (README.md).
set -euo pipefail
db=$1; seconds=${2:-50}
here=$(cd "$(dirname "$0")" && pwd)
pgbench=/usr/lib/postgresql/15/bin/pgbench
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
(cd "$logs" && "$pgbench" -n -c 1 -T "$seconds" -f "$here/emit.sql" -l --log-prefix="$logs/emit" "$db" >/dev/null 2>&1) &
emitting=$!
sleep 2
start=$(date +%s.%N)
psql -X -qAt "$db" -c "select * from watchpump.prune('7 days', '30 days', 500)" >/dev/null
end=$(date +%s.%N)
wait "$emitting"
awk -v s="$start" -v e="$end" 'BEGIN { printf "prune() call: %.2f s\n", e - s }'
# pgbench's log: client, transaction, latency (µs), ...
awk '{ if ($3 > m) m = $3; n++ } END { printf "%d emits, the longest %.1f ms\n", n, m / 1000 }' "$logs"/emit*
