#!/usr/bin/env bash
# Pumps as separate hosts, for the chaos suite's partition fault
# (`make chaos FAULTS=partition`): a network namespace per host with an
# address of its own, joined to this machine by a veth pair on a bridge
# (10.231.0.1/24 here, 10.231.0.11, .12, ... the hosts). The pumps reach
# PostgreSQL through HAProxy on 10.231.0.1 and the consumers, which listen
# on 10.231.0.1 too. Partitions are nftables drop rules on this machine's
# side, matching the host's address: its packets vanish on the way (no
# refusal, and no local error in the host's own stack, which a drop rule in
# its namespace's output chain would give), as in a real partition. Nothing
# leaves this machine: the bridge has no other port.
#
#   scripts/chaos-net.sh up    DIR HOSTS FRONT_PORT PG_PORT
#   scripts/chaos-net.sh cut   DIR HOST PORT...   (HOST 1..HOSTS; drops its
#                                                  traffic to and from those
#                                                  ports on 10.231.0.1)
#   scripts/chaos-net.sh heal  DIR HOST
#   scripts/chaos-net.sh down  DIR               (removes all of it)
set -euo pipefail

cmd=${1:?usage: chaos-net.sh up|cut|heal|down DIR ...}
dir=${2:?directory}
PREFIX=wpchaos
BRIDGE=$PREFIX-br
GATEWAY=10.231.0.1

install() {
  local want=()
  command -v ip >/dev/null || want+=(iproute2)
  command -v nft >/dev/null || [ -x /usr/sbin/nft ] || want+=(nftables)
  command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || want+=(haproxy)
  if [ ${#want[@]} -gt 0 ]; then
    echo "chaos-net: installing ${want[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
  fi
}

ns() { echo "$PREFIX-h$1"; }
NFT=$(type -P nft || echo /usr/sbin/nft)
nft() { "$NFT" "$@"; }
# One table per cut host on this machine, removed to heal.
table() { echo "${PREFIX}_h$1"; }

case "$cmd" in
  up)
    install
    hosts=${3:?HOSTS} front=${4:?FRONT_PORT} pg=${5:?PG_PORT}
    "$0" down "$dir" 2>/dev/null || true
    mkdir -p "$dir"
    ip link add "$BRIDGE" type bridge
    ip addr add "$GATEWAY/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for h in $(seq "$hosts"); do
      ip netns add "$(ns "$h")"
      ip link add "$PREFIX-$h-a" type veth peer name "$PREFIX-$h-b" netns "$(ns "$h")"
      ip link set "$PREFIX-$h-a" master "$BRIDGE" up
      ip -n "$(ns "$h")" addr add "10.231.0.$((10 + h))/24" dev "$PREFIX-$h-b"
      ip -n "$(ns "$h")" link set "$PREFIX-$h-b" up
      ip -n "$(ns "$h")" link set lo up
    done
    cat >"$dir/haproxy.cfg" <<CFG
global
    maxconn 2000

defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h

# The database as the hosts see it.
listen postgres
    bind $GATEWAY:$front
    server pg 127.0.0.1:$pg
CFG
    "$(command -v haproxy || echo /usr/sbin/haproxy)" -f "$dir/haproxy.cfg" -D -p "$dir/haproxy.pid" >&2
    echo "$GATEWAY"
    ;;
  cut)
    host=${3:?HOST}
    shift 3
    ports=$(IFS=,; echo "$*")
    addr="10.231.0.$((10 + host))"
    t=$(table "$host")
    nft add table inet "$t"
    nft "add chain inet $t in { type filter hook input priority 0; }"
    nft "add chain inet $t out { type filter hook output priority 0; }"
    nft add rule inet "$t" in ip saddr "$addr" ip daddr "$GATEWAY" tcp dport "{ $ports }" drop
    nft add rule inet "$t" out ip saddr "$GATEWAY" ip daddr "$addr" tcp sport "{ $ports }" drop
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
    for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-h" || true); do
      ip netns del "$n"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: chaos-net.sh up|cut|heal|down DIR ..." >&2
    exit 2
    ;;
esac
