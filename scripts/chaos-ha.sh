#!/usr/bin/env bash
# A primary, a streaming standby and HAProxy in front, for the chaos suite's
# failover fault (`make chaos FAULTS=failover [SYNC=off]`). Everything lives
# in one directory (target/chaos-ha, or under /tmp when the postgres user
# cannot reach the checkout) and is removed by `stop`.
#
#   scripts/chaos-ha.sh start    DIR PORT_A PORT_B PORT_FRONT on|off
#       fresh clusters a (primary) and b (standby, streaming from a;
#       synchronous when `on`), HAProxy on 127.0.0.1:PORT_FRONT sending
#       every connection to the primary; prints the front's URL last
#   scripts/chaos-ha.sh failover DIR [LAG_MS]
#       freezes the primary's WAL sender for LAG_MS (SIGSTOP: a standby
#       fallen behind, as over a slow or congested link; 0 or absent: none),
#       then stops the primary with `-m immediate` (a crash), promotes the
#       standby, and switches HAProxy to it through its runtime API (the old
#       primary's sessions are shut down); the new primary commits without a
#       standby until `rebuild` (as Patroni does without synchronous_mode_strict)
#   scripts/chaos-ha.sh rebuild  DIR
#       the old primary becomes the new primary's standby: pg_rewind (or a
#       fresh pg_basebackup if that fails), started, streaming, and
#       synchronous again when the pair was started `on`
#   scripts/chaos-ha.sh stop     DIR
#       stops HAProxy and both clusters, removes DIR
#
# Why HAProxy alone and not Patroni with etcd: on a 2-core machine shared
# with builds, etcd and two Patroni agents add three daemons whose timeouts
# (a leader TTL of 30 s by default) decide when a failover happens. The
# suite wants failovers at moments it chooses, under load, twice per run:
# it plays Patroni's part (stop, promote, switch the front, rebuild) with
# the same PostgreSQL commands Patroni runs, and the front is the same
# HAProxy a Patroni setup puts in front of its clusters.
set -euo pipefail

cmd=${1:?usage: chaos-ha.sh start|failover|rebuild|stop DIR ...}
dir=${2:?directory}

find_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

as_pg() { (cd / && runuser -u postgres -- "$@"); }

# What the suite needs and a fresh machine may lack: PostgreSQL and HAProxy
# (Debian packages), and the postgres user to run PostgreSQL as (it refuses
# to run as root).
install() {
  local want=()
  find_bindir >/dev/null || want+=(postgresql)
  command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || want+=(haproxy)
  if [ ${#want[@]} -gt 0 ]; then
    echo "chaos-ha: installing ${want[*]}" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
  fi
  id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql postgres
}

haproxy_bin() { command -v haproxy || echo /usr/sbin/haproxy; }

# One command to HAProxy's runtime API (the admin-level stats socket).
runtime() {
  python3 - "$dir/haproxy.sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
out = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
text = out.decode().strip()
if text:
    print(text, file=sys.stderr)
PY
}

port_of() { cat "$dir/$1.port"; }
sql() { "$bindir/psql" -h 127.0.0.1 -p "$(port_of "$1")" -U postgres -d postgres -qtAX -c "$2"; }
pgctl() { as_pg "$bindir/pg_ctl" -D "$dir/$1" "${@:2}"; }

# Waits until the primary reports its standby streaming (and, when the pair
# is synchronous, as its synchronous standby).
wait_streaming() {
  local primary=$1 want=async
  [ "$(cat "$dir/sync")" = on ] && want=sync
  for _ in $(seq 600); do
    [ "$(sql "$primary" "select count(*) from pg_stat_replication where state = 'streaming' and sync_state = '$want'" 2>/dev/null)" = 1 ] && return 0
    sleep 0.1
  done
  echo "chaos-ha: the standby of $primary is not streaming ($want)" >&2
  return 1
}

# The synchronous_standby_names a primary runs with: any one standby, when
# the pair is synchronous.
set_sync() {
  local node=$1 names=$2
  sql "$node" "alter system set synchronous_standby_names = '$names'" && sql "$node" "select pg_reload_conf()" >/dev/null
}

start_node() {
  pgctl "$1" -l "$dir/$1.log" -w -t 120 -o "-p $(port_of "$1")" start >&2
}

bindir=$(find_bindir || true)
case "$cmd" in
  start)
    install
    bindir=$(find_bindir)
    pa=${3:?PORT_A} pb=${4:?PORT_B} front=${5:?PORT_FRONT} sync=${6:-on}
    "$0" stop "$dir" 2>/dev/null || true
    mkdir -p "$dir"
    if ! runuser -u postgres -- test -w "$dir" 2>/dev/null; then chown postgres "$dir"; fi
    if ! runuser -u postgres -- test -w "$dir"; then
      echo "chaos-ha: the postgres user cannot write $dir" >&2
      exit 1
    fi
    echo "$pa" >"$dir/a.port"; echo "$pb" >"$dir/b.port"; echo "$sync" >"$dir/sync"
    as_pg "$bindir/initdb" -D "$dir/a" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    cat >>"$dir/a/postgresql.conf" <<CONF
# watchpump's chaos pair (scripts/chaos-ha.sh)
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 200
shared_buffers = 128MB
wal_level = replica
max_wal_senders = 5
wal_keep_size = 512MB
hot_standby = on
# pg_rewind needs hint bits in the WAL (or data checksums).
wal_log_hints = on
fsync = on
log_min_messages = warning
log_min_error_statement = panic
CONF
    start_node a
    as_pg "$bindir/pg_basebackup" -h 127.0.0.1 -p "$pa" -U postgres -D "$dir/b" -X stream -R \
      -d "application_name=b" >&2
    # Each node names itself to its primary; pg_basebackup copied a's files.
    echo "primary_conninfo = 'host=127.0.0.1 port=$pa user=postgres application_name=b'" >>"$dir/b/postgresql.auto.conf"
    start_node b
    [ "$sync" = on ] && set_sync a '*'
    wait_streaming a
    echo a >"$dir/primary"
    cat >"$dir/haproxy.cfg" <<CFG
global
    stats socket $dir/haproxy.sock mode 600 level admin
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

# No health checks: the suite switches the front itself (as Patroni's REST
# check would), server by server, through the runtime API.
listen postgres
    bind 127.0.0.1:$front
    server a 127.0.0.1:$pa
    server b 127.0.0.1:$pb disabled
CFG
    "$(haproxy_bin)" -f "$dir/haproxy.cfg" -D -p "$dir/haproxy.pid" >&2
    for _ in $(seq 100); do [ -S "$dir/haproxy.sock" ] && break; sleep 0.05; done
    echo "postgres://postgres@127.0.0.1:$front/postgres"
    ;;
  failover)
    old=$(cat "$dir/primary")
    new=$([ "$old" = a ] && echo b || echo a)
    lag_ms=${3:-0}
    if [ "$lag_ms" -gt 0 ]; then
      # The primary's WAL sender is frozen (SIGSTOP), so the standby falls
      # behind. Asynchronous: the primary commits on, and what it commits
      # now the standby never gets. Synchronous: commits wait for the
      # standby, and the crash leaves them in doubt (never acknowledged).
      # The sender is then killed where it stands (SIGKILL reaches a stopped
      # process): resumed, it would send what it held before dying.
      sender=$(sql "$old" "select pid from pg_stat_replication" | head -1 || true)
      if [ -n "$sender" ]; then
        kill -STOP "$sender"
        sleep "$(printf '%d.%03d' $((lag_ms / 1000)) $((lag_ms % 1000)))"
        kill -KILL "$sender"
      fi
    fi
    pgctl "$old" -m immediate -w stop >&2
    pgctl "$new" -w -t 120 promote >&2
    # Alone until rebuilt: committing must not wait for a standby.
    [ "$(cat "$dir/sync")" = on ] && set_sync "$new" ''
    runtime "set server postgres/$old state maint"
    runtime "shutdown sessions server postgres/$old"
    runtime "set server postgres/$new state ready"
    echo "$new" >"$dir/primary"
    ;;
  rebuild)
    primary=$(cat "$dir/primary")
    old=$([ "$primary" = a ] && echo b || echo a)
    source="host=127.0.0.1 port=$(port_of "$primary") user=postgres dbname=postgres application_name=$old"
    # Until the promoted primary's first checkpoint its control file still
    # names the old timeline, and pg_rewind would find nothing to rewind.
    sql "$primary" "checkpoint"
    if ! as_pg "$bindir/pg_rewind" -D "$dir/$old" --source-server="$source" -R >"$dir/rewind.log" 2>&1; then
      echo "chaos-ha: pg_rewind failed (see $dir/rewind.log); taking a fresh base backup" >&2
      rm -rf "$dir/$old"
      as_pg "$bindir/pg_basebackup" -h 127.0.0.1 -p "$(port_of "$primary")" -U postgres -D "$dir/$old" -X stream -R >&2
    fi
    echo "primary_conninfo = '$source'" >>"$dir/$old/postgresql.auto.conf"
    # The old primary's own sync setting came along; a standby ignores it.
    start_node "$old"
    [ "$(cat "$dir/sync")" = on ] && set_sync "$primary" '*'
    wait_streaming "$primary"
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    if [ -s "$dir/haproxy.pid" ]; then
      kill "$(cat "$dir/haproxy.pid")" 2>/dev/null || true
    fi
    for node in a b; do
      if [ -n "$bindir" ] && [ -f "$dir/$node/PG_VERSION" ]; then
        pgctl "$node" -m immediate -w stop >/dev/null 2>&1 || true
      fi
    done
    rm -rf "$dir"
    ;;
  *)
    echo "usage: chaos-ha.sh start|failover|rebuild|stop DIR ..." >&2
    exit 2
    ;;
esac
