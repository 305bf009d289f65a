#!/usr/bin/env bash
# Pumps as separate hosts, all on loopback, for the chaos suite's partition
# fault (`make chaos FAULTS=partition`). Host H is a loopback source address
# of its own, 127.0.0.(10+H) (all of 127/8 is local on Linux), that its pump
# sends its deliveries from (WATCHPUMP_SOURCE_ADDRESS), and a HAProxy front
# port of its own that its pump reaches PostgreSQL through. Partitions are
# nftables drop rules on `lo` (the input and output hooks see loopback
# packets): cut from the database, the host's front port is dropped both
# ways; cut from its consumers, packets from its source address to the
# consumer ports and back are dropped. Packets vanish (no refusal, no reset),
# as in a real partition. Nothing but loopback is used.
#
#   scripts/chaos-net.sh up    DIR PG_PORT FRONT_PORT...  (one front port
#                                                  per host, host 1 first)
#   scripts/chaos-net.sh cut-db        DIR HOST FRONT_PORT
#   scripts/chaos-net.sh cut-consumers DIR HOST PORT...
#   scripts/chaos-net.sh heal  DIR HOST
#   scripts/chaos-net.sh down  DIR               (removes all of it)
#   scripts/chaos-net.sh source HOST             (prints the host's address)
set -euo pipefail

cmd=${1:?usage: chaos-net.sh up|cut-db|cut-consumers|heal|down|source ...}
PREFIX=wpchaos

source_of() { echo "127.0.0.$((10 + $1))"; }

if [ "$cmd" = source ]; then
  source_of "${2:?HOST}"
  exit 0
fi
dir=${2:?directory}

install() {
  local want=()
  command -v nft >/dev/null || [ -x /usr/sbin/nft ] || want+=(nftables)
  command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || want+=(haproxy)
  if [ ${#want[@]} -gt 0 ]; then
    echo "chaos-net: installing ${want[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
  fi
}

NFT=$(type -P nft || echo /usr/sbin/nft)
nft() { "$NFT" "$@"; }
# One table per cut host, removed to heal.
table() { echo "${PREFIX}_h$1"; }
new_table() {
  local t
  t=$(table "$1")
  nft add table inet "$t"
  nft "add chain inet $t in { type filter hook input priority 0; }"
  nft "add chain inet $t out { type filter hook output priority 0; }"
  echo "$t"
}

case "$cmd" in
  up)
    install
    pg=${3:?PG_PORT}
    shift 3
    [ $# -gt 0 ] || { echo "chaos-net: up needs a front port per host" >&2; exit 2; }
    "$0" down "$dir" 2>/dev/null || true
    mkdir -p "$dir"
    {
      cat <<CFG
global
    maxconn 2000

defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    # Keepalives toward the pumps: a pump cut off from the front is noticed
    # in about 11 s and its session (with a leader's advisory lock) closed
    # on the server, as docs/scaling.md asks of a proxy in production.
    option clitcpka
    clitcpka-idle 5s
    clitcpka-intvl 2s
    clitcpka-cnt 3
CFG
      h=0
      for front in "$@"; do
        h=$((h + 1))
        cat <<CFG

# The database as host $h sees it: a port of its own, to cut it alone.
listen postgres_h$h
    bind 127.0.0.1:$front
    server pg 127.0.0.1:$pg
CFG
      done
    } >"$dir/haproxy.cfg"
    "$(command -v haproxy || echo /usr/sbin/haproxy)" -f "$dir/haproxy.cfg" -D -p "$dir/haproxy.pid" >&2
    ;;
  cut-db)
    host=${3:?HOST} front=${4:?FRONT_PORT}
    t=$(new_table "$host")
    for chain in in out; do
      nft add rule inet "$t" "$chain" tcp dport "$front" drop
      nft add rule inet "$t" "$chain" tcp sport "$front" drop
    done
    ;;
  cut-consumers)
    host=${3:?HOST}
    shift 3
    ports=$(IFS=,; echo "$*")
    addr=$(source_of "$host")
    t=$(new_table "$host")
    for chain in in out; do
      nft add rule inet "$t" "$chain" ip saddr "$addr" tcp dport "{ $ports }" drop
      nft add rule inet "$t" "$chain" ip daddr "$addr" tcp sport "{ $ports }" drop
    done
    ;;
  heal)
    host=${3:?HOST}
    nft delete table inet "$(table "$host")" 2>/dev/null || true
    ;;
  down)
    if [ -s "$dir/haproxy.pid" ]; then kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true; fi
    for t in $(nft list tables 2>/dev/null | awk '{print $3}' | grep "^${PREFIX}_h" || true); do
      nft delete table inet "$t"
    done
    rm -rf "$dir"
    ;;
  *)
    echo "usage: chaos-net.sh up|cut-db|cut-consumers|heal|down|source ..." >&2
    exit 2
    ;;
esac
