#!/usr/bin/env bash
# Start (or stop) a project-local PostgreSQL cluster for `make run`, `make test`
# and `make bench`, and print its DATABASE_URL on the last line of stdout.
#
#   scripts/dev-postgres.sh start NAME PORT|auto [fsync=on|off]
#   scripts/dev-postgres.sh stop  NAME     (quiet when it is not running)
#   scripts/dev-postgres.sh restart NAME   (a fast restart, for the chaos suite)
#   scripts/dev-postgres.sh port  NAME     (prints the port `auto` means)
#   scripts/dev-postgres.sh standby NAME PORT PRIMARY_PORT
#       a fresh streaming standby of the cluster on PRIMARY_PORT (a
#       pg_basebackup of it), in target/NAME, started on PORT
#   scripts/dev-postgres.sh remove NAME    (stops it, deletes target/NAME)
#
# `auto` (what `make test`, `make bench` and the chaos suite use): a free
# port chosen the first time, among 20000-32767 (below Linux's ephemeral
# range, so outgoing connections do not take it), and remembered in
# target/NAME.port, so that each checkout keeps its own. When the port is
# taken anyway, the error names the setting that moves it (PG_TEST_PORT,
# ...), and deleting target/NAME.port chooses another.
#
# The cluster lives in target/NAME. It uses the installed PostgreSQL binaries
# (installing Debian's postgresql package when none are found), trusts local
# connections on 127.0.0.1 only, and runs as the `postgres` user when invoked
# as root, because PostgreSQL refuses to run as root.
set -euo pipefail

cmd=${1:?usage: dev-postgres.sh start|stop|restart|port|standby|remove NAME [PORT|auto] [fsync|PRIMARY_PORT]}
name=${2:?cluster name}
port=${3:-54329}
fsync=${4:-on}
root=$(cd "$(dirname "$0")/.." && pwd)
data="$root/target/$name"

# The make variable that sets each cluster's port, for messages.
setting() {
  case "$name" in
    pg) echo PG_RUN_PORT ;;
    pg-test) echo PG_TEST_PORT ;;
    pg-bench) echo PG_BENCH_PORT ;;
    pg-chaos) echo "PG_CHAOS_PORT (WATCHPUMP_CHAOS_PG_PORT for cargo test)" ;;
    *) echo "the PORT argument" ;;
  esac
}

port_free() {
  python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

# The port remembered in target/NAME.port, chosen (free, at random) the
# first time.
remembered_port() {
  local file="$root/target/$name.port" p
  if [ -s "$file" ]; then cat "$file"; return 0; fi
  mkdir -p "$root/target"
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12768))
    if port_free "$p"; then echo "$p" >"$file"; echo "$p"; return 0; fi
  done
  echo "dev-postgres: found no free port for $name; set $(setting)" >&2
  return 1
}

if [ "$cmd" = port ]; then
  remembered_port
  exit 0
fi
[ "$port" = auto ] && port=$(remembered_port)

find_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

bindir=$(find_bindir || true)
if [ -z "$bindir" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "dev-postgres: no PostgreSQL found; installing Debian's postgresql package" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    bindir=$(find_bindir) || { echo "dev-postgres: PostgreSQL install failed" >&2; exit 1; }
  else
    echo "dev-postgres: no PostgreSQL binaries found; install the postgresql package" >&2
    exit 1
  fi
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

# Makes the data directory, owned by the postgres user when run as root.
make_data_dir() {
    if [ "$(id -u)" = 0 ]; then
      id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql postgres
      mkdir -p "$data" && chown postgres "$data" && chmod 700 "$data"
      # The postgres user must reach the data directory; a checkout under a
      # private folder (such as /root) is not reachable, so the cluster then
      # lives under /tmp, with a link from target/ for finding it.
      if ! runuser -u postgres -- test -w "$data"; then
        rmdir "$data" 2>/dev/null || true
        data="/tmp/watchpump-$(printf '%s' "$root" | sha256sum | cut -c1-12)/$name"
        mkdir -p "$data" && chown postgres "$(dirname "$data")" "$data" && chmod 700 "$data"
        ln -sfn "$data" "$root/target/$name"
        echo "dev-postgres: $root is not reachable by the postgres user; the cluster lives in $data" >&2
      fi
    else
      mkdir -p "$data"
    fi
}

case "$cmd" in
  start)
    mkdir -p "$root/target"
    [ -L "$data" ] && data=$(readlink "$data")
    # Checked before anything is set up, so that the message names the
    # setting instead of PostgreSQL's "could not bind" in a log.
    running_here=$([ -f "$data/postmaster.pid" ] && sed -n 4p "$data/postmaster.pid" 2>/dev/null || true)
    if [ "$running_here" != "$port" ] && ! port_free "$port"; then
      echo "dev-postgres: cannot start $name on port $port: the port is in use (another program, or another checkout's cluster)." >&2
      echo "dev-postgres: choose another with $(setting)=<port>, or delete target/$name.port to have a free one chosen." >&2
      exit 1
    fi
    make_data_dir
    if [ ! -f "$data/PG_VERSION" ]; then
      as_owner "$bindir/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-sync >"$root/target/$name.initdb.log" 2>&1 \
        || { cat "$root/target/$name.initdb.log" >&2; exit 1; }
      cat >>"$data/postgresql.conf" <<CONF
# watchpump's project-local cluster
listen_addresses = '127.0.0.1'
unix_socket_directories = '$data'
max_connections = 300
shared_buffers = 256MB
log_min_messages = warning
log_min_error_statement = panic
CONF
    fi
    # Running on another port (the port was changed since): restart it.
    if as_owner "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1 \
       && [ "$(sed -n 4p "$data/postmaster.pid" 2>/dev/null)" != "$port" ]; then
      as_owner "$bindir/pg_ctl" -D "$data" -m fast -w stop >&2
    fi
    # pg_stat_statements for the bench's figures (database time per
    # delivery), in the bench's cluster only: watchpump needs no extension
    # in the producer's database, and the tests must show it.
    preload=""
    [ "$name" = pg-bench ] && preload="-c shared_preload_libraries=pg_stat_statements"
    if ! as_owner "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
        -o "-p $port -c fsync=$fsync -c synchronous_commit=$fsync -c track_commit_timestamp=on $preload" start >&2 \
        || { tail -20 "$data/server.log" >&2; echo "dev-postgres: $name did not start on port $port; $(setting) moves it" >&2; exit 1; }
    fi
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  restart)
    [ -L "$data" ] && data=$(readlink "$data")
    as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -m fast -w -t 60 restart >&2
    ;;
  stop)
    [ -L "$data" ] && data=$(readlink "$data")
    # Quiet when it is not running (pg_ctl would say "PID file ... does not exist").
    if [ -f "$data/PG_VERSION" ] && as_owner "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      as_owner "$bindir/pg_ctl" -D "$data" -m fast -w stop >&2 || true
    fi
    ;;
  standby)
    primary_port=${4:?usage: dev-postgres.sh standby NAME PORT PRIMARY_PORT}
    "$0" remove "$name"
    mkdir -p "$root/target"
    make_data_dir
    # -R writes standby.signal and primary_conninfo: it streams from the
    # primary as soon as it starts. The copied postgresql.conf names the
    # primary's socket directory; -k gives the standby its own.
    as_owner "$bindir/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$data" \
      -X stream -R -c fast >&2
    as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
      -o "-p $port -k $data" start >&2 \
      || { tail -20 "$data/server.log" >&2; exit 1; }
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  remove)
    "$0" stop "$name"
    [ -L "$data" ] && { rm -rf "$(readlink "$data")"; rm -f "$data"; }
    rm -rf "$data" "$root/target/$name.initdb.log"
    ;;
  *)
    echo "usage: dev-postgres.sh start|stop|restart|port|standby|remove NAME [PORT|auto] [fsync|PRIMARY_PORT]" >&2
    exit 2
    ;;
esac
