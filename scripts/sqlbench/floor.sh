#!/bin/bash
# 20,000 emits, then floor.sql BATCH at a time: the least the storage costs
# a delivery, beside claim_complete.sh's figure (README.md). With "bare"
# as a third argument, the history's day partitions lose every index but
# their primary key first: what the row work costs with no index for the
# reads (a database to throw away afterwards).
set -euo pipefail
db=$1; batch=${2:-10}
if [ "${3:-}" = bare ]; then
    psql -X -q -At "$db" -c "select format('drop index watchpump.%I;', i.indexname)
                             from pg_indexes i
                             where i.schemaname = 'watchpump' and i.tablename ~ '^settled_[0-9]+$'
                               and i.indexdef not like 'CREATE UNIQUE INDEX%'" | psql -X -q "$db"
fi
exec "$(dirname "$0")/claim_complete.sh" "$db" "$batch" floor.sql
