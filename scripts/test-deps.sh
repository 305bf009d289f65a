#!/usr/bin/env bash
# Installs what the test suite needs beyond Rust and PostgreSQL, when missing:
# prometheus/promtool (metrics checks), pgbouncer (tests/pooler.rs),
# chromium and chromium-driver (the panel's browser test, tests/panel.rs),
# Python's standardwebhooks (the signing interop test), and, as root,
# HAProxy and nftables (the short failover and partition runs of
# tests/chaos, which run only as root), and Debian's Patroni and etcd
# unpacked into target/tools with Patroni's Python libraries (the failover
# run's cluster: scripts/patroni-tools.sh). Says clearly what it could not
# install.
#
# All apt installs happen here, before the tests start: the chaos scripts
# can install HAProxy and nftables themselves, but two of them doing it at
# once, from tests running in parallel, contend for dpkg's lock.
#
# Prometheus comes from Debian's package, unpacked into target/tools rather
# than installed: installing it would also enable a system Prometheus
# service that starts at every boot.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# A clean run writes about 8 GiB under target/ (the debug and release
# builds, the test cluster's databases and WAL). A disk that fills midway
# makes PostgreSQL stop with "No space left on device" and every later test
# fail to connect, which reads like a bug; so say so before starting.
free_kib=$(df -Pk "$root" | awk 'NR == 2 { print $4 }')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((8 * 1024 * 1024)) ]; then
  echo "test-deps: warning: $((free_kib / 1024 / 1024)) GiB free where the tests write ($root/target);" \
    "a clean run needs about 8 GiB, and a full disk stops the test cluster midway" >&2
fi
# Python's standardwebhooks, the independent implementation the signing
# interop test (tests/signing_interop.rs) checks our signatures against, and
# Python's cryptography, whose ed25519 checks our v1a signatures
# (tests/signing_ed25519_interop.rs).
if [ ! -x "$root/target/py/bin/python" ] || ! "$root/target/py/bin/python" -c 'import standardwebhooks, cryptography' 2>/dev/null; then
  echo "test-deps: installing Python's standardwebhooks and cryptography into target/py" >&2
  { [ -x "$root/target/py/bin/python" ] || python3 -m venv "$root/target/py" >&2; } \
    && "$root/target/py/bin/pip" install -q standardwebhooks==1.1.0 cryptography==46.0.3 >&2 \
    || { echo "test-deps: could not install standardwebhooks and cryptography from PyPI" >&2; exit 1; }
fi
tools="$root/target/tools"
if ! { command -v promtool && command -v prometheus; } >/dev/null 2>&1 && [ ! -x "$tools/bin/promtool" ]; then
  echo "test-deps: unpacking Debian's prometheus package into target/tools (not installing it)" >&2
  work=$(mktemp -d)
  if ! { (cd "$work" && apt-get download -qq prometheus 2>/dev/null) \
         || { [ "$(id -u)" = 0 ] && apt-get update -qq && (cd "$work" && apt-get download -qq prometheus); }; } >&2; then
    echo "test-deps: could not download Debian's prometheus package (apt-get download prometheus)" >&2
    exit 1
  fi
  mkdir -p "$tools/bin" && dpkg-deb -x "$work"/prometheus_*.deb "$tools/prometheus" \
    && ln -sf "$tools/prometheus/usr/bin/prometheus" "$tools/prometheus/usr/bin/promtool" "$tools/bin/" \
    || { echo "test-deps: could not unpack the prometheus package" >&2; exit 1; }
  rm -rf "$work"
fi
# pgbouncer (tests/pooler.rs) from Debian's package, unpacked into
# target/tools with the one library it needs that the machine may lack
# (libc-ares2), for the same reason as Prometheus: installing it would
# enable a system pgbouncer service on port 6432. The tests run it as a
# child process with a config of their own. target/tools/bin/pgbouncer
# finds the unpacked library.
if [ ! -x "$tools/bin/pgbouncer" ]; then
  echo "test-deps: unpacking Debian's pgbouncer package into target/tools (not installing it)" >&2
  work=$(mktemp -d)
  if ! { (cd "$work" && apt-get download -qq pgbouncer libc-ares2 2>/dev/null) \
         || { [ "$(id -u)" = 0 ] && apt-get update -qq && (cd "$work" && apt-get download -qq pgbouncer libc-ares2); }; } >&2; then
    echo "test-deps: could not download Debian's pgbouncer package (apt-get download pgbouncer libc-ares2)" >&2
    exit 1
  fi
  mkdir -p "$tools/bin" && for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$tools/pgbouncer" || exit 1; done \
    && lib=$(dirname "$(find "$tools/pgbouncer" -name 'libcares.so.2*' | head -1)") \
    && printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/pgbouncer/usr/sbin/pgbouncer" "$@"\n' "$lib" "$tools" >"$tools/bin/pgbouncer" \
    && chmod +x "$tools/bin/pgbouncer" \
    || { echo "test-deps: could not unpack the pgbouncer package" >&2; exit 1; }
  rm -rf "$work"
fi
need=()
command -v chromium >/dev/null 2>&1 || [ -x /usr/lib/chromium/chromium ] || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ "$(id -u)" = 0 ]; then
  command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
  command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
fi
if [ "$(id -u)" = 0 ]; then
  "$root/scripts/patroni-tools.sh" || exit 1
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "test-deps: missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root" >&2
  exit 1
fi
echo "test-deps: installing ${need[*]} with apt" >&2
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } >&2; then
  echo "test-deps: could not install ${need[*]} with apt" >&2
  exit 1
fi
# Debian's haproxy package enables its system service; the tests start
# HAProxy themselves and leave no system service enabled.
for unit in haproxy.service; do
  if [ -e "/etc/systemd/system/multi-user.target.wants/$unit" ]; then
    systemctl disable "$unit" >/dev/null 2>&1 || rm -f "/etc/systemd/system/multi-user.target.wants/$unit"
  fi
done
