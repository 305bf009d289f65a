#!/usr/bin/env bash
# Debian's Patroni (3.0.2 in bookworm) and etcd (3.4), for the chaos suite's
# failover fault (`make chaos FAULTS=failover`, and its short form in
# `make test`): unpacked into target/tools, not installed. Installing the
# `patroni` and `etcd-server` packages would enable (and, for etcd, start) a
# system service that comes back at every boot; the suite runs both as its
# own child processes instead, with their configuration under target/.
# Patroni's Python libraries are installed with apt: plain libraries, no
# service; so are HAProxy (the front that asks Patroni which node is the
# primary) and nftables (the suite's partition from etcd) when missing. Run
# as root (apt); prints nothing when all is there already.
#
#   scripts/patroni-tools.sh          installs what is missing
#   scripts/patroni-tools.sh check    exits 1 when something is missing
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/target/tools"
# What Patroni imports (the Depends of Debian's patroni package, with
# python3-etcd for its etcd3 client), for Debian's /usr/bin/python3.
libs=(python3-cdiff python3-click python3-dateutil python3-pkg-resources python3-prettytable
  python3-psutil python3-urllib3 python3-yaml python3-psycopg2 python3-etcd)

have_tools() {
  { command -v haproxy || [ -x /usr/sbin/haproxy ]; } >/dev/null 2>&1 \
    && { command -v nft || [ -x /usr/sbin/nft ]; } >/dev/null 2>&1 \
    && [ -f "$tools/patroni/usr/lib/python3/dist-packages/patroni/__main__.py" ] \
    && [ -x "$tools/etcd/usr/bin/etcd" ] \
    && /usr/bin/python3 -c 'import click, dateutil, prettytable, psutil, urllib3, yaml, psycopg2, etcd, cdiff' 2>/dev/null
}

if have_tools; then exit 0; fi
[ "${1:-}" = check ] && exit 1
if [ "$(id -u)" != 0 ]; then
  echo "patroni-tools: Patroni and etcd are missing from target/tools; run as root (apt-get) to have them unpacked" >&2
  exit 1
fi
echo "patroni-tools: unpacking Debian's patroni and etcd-server into target/tools (not installing them)" >&2
apt-get update -qq >&2
want=("${libs[@]}")
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || want+=(haproxy)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || want+=(nftables)
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >&2 \
  || { echo "patroni-tools: could not install ${want[*]}" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt downloads as its own user where it can write (else it warns).
id _apt >/dev/null 2>&1 && chown _apt "$work"
(cd "$work" && apt-get download -qq patroni etcd-server) >&2 \
  || { echo "patroni-tools: could not download Debian's patroni and etcd-server packages" >&2; exit 1; }
mkdir -p "$tools"
rm -rf "$tools/patroni" "$tools/etcd"
dpkg-deb -x "$work"/patroni_*.deb "$tools/patroni"
dpkg-deb -x "$work"/etcd-server_*.deb "$tools/etcd"
have_tools || { echo "patroni-tools: Patroni or etcd does not run after unpacking" >&2; exit 1; }
