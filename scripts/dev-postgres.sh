#!/usr/bin/env bash
# Start (or stop) a project-local PostgreSQL cluster for `make run`, `make test`
# and `make bench`, and print its DATABASE_URL on the last line of stdout.
#
#   scripts/dev-postgres.sh start NAME PORT [fsync=on|off]
#   scripts/dev-postgres.sh stop  NAME
#   scripts/dev-postgres.sh restart NAME   (a fast restart, for the chaos suite)
#
# The cluster lives in target/NAME. It uses the installed PostgreSQL binaries
# (installing Debian's postgresql package when none are found), trusts local
# connections on 127.0.0.1 only, and runs as the `postgres` user when invoked
# as root, because PostgreSQL refuses to run as root.
set -euo pipefail

cmd=${1:?usage: dev-postgres.sh start|stop NAME [PORT] [fsync]}
name=${2:?cluster name}
port=${3:-54329}
fsync=${4:-on}
root=$(cd "$(dirname "$0")/.." && pwd)
data="$root/target/$name"

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

case "$cmd" in
  start)
    mkdir -p "$root/target"
    [ -L "$data" ] && data=$(readlink "$data")
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
    if ! as_owner "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
      as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
        -o "-p $port -c fsync=$fsync -c synchronous_commit=$fsync -c track_commit_timestamp=on -c shared_preload_libraries=pg_stat_statements" start >&2 \
        || { tail -20 "$data/server.log" >&2; exit 1; }
    fi
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
  restart)
    [ -L "$data" ] && data=$(readlink "$data")
    as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -m fast -w -t 60 restart >&2
    ;;
  stop)
    [ -L "$data" ] && data=$(readlink "$data")
    if [ -f "$data/PG_VERSION" ]; then
      as_owner "$bindir/pg_ctl" -D "$data" -m fast -w stop >&2 || true
    fi
    ;;
  *)
    echo "usage: dev-postgres.sh start|stop|restart NAME [PORT] [fsync]" >&2
    exit 2
    ;;
esac
