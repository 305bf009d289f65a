#!/bin/bash
# 20,000 emits, then floor.sql BATCH at a time: the least the storage costs
# a delivery, beside claim_complete.sh's figure (README.md).
exec "$(dirname "$0")/claim_complete.sh" "$1" "${2:-10}" floor.sql
