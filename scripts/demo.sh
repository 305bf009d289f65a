#!/usr/bin/env bash
# `make demo`: about 15 seconds of watchpump in this terminal. A consumer that
# prints what it receives (and fails one delivery once, to show a retry), a
# pump, and a producer emitting a few changes; then the consumer goes away,
# the backlog waits in watchpump.backlog, and it is delivered when the
# consumer comes back. Uses make run's cluster, in a database of its own
# (watchpump_demo, made afresh), and stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-54329}

if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
say() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
export PGOPTIONS='-c client_min_messages=warning'
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

say "building watchpump (release; the first build takes a few minutes)"
cargo build --release --quiet --bin watchpump
bin=target/release/watchpump

admin=$(scripts/dev-postgres.sh start pg "$port" on | tail -1)
psql "$admin" -qc "drop database if exists watchpump_demo with (force)" -c "create database watchpump_demo"
export DATABASE_URL="${admin%/postgres}/watchpump_demo"
# The demo's database is its own: a key of its own seals its signing secrets.
WATCHPUMP_SECRET_KEY=$(head -c 32 /dev/urandom | base64)
export WATCHPUMP_SECRET_KEY
# The demo's consumer listens on this host: production refuses loopback
# destinations unless they are listed.
export WATCHPUMP_ALLOWED_DESTINATIONS="127.0.0.0/8,::1"
"$bin" migrate >/dev/null

consumer_port=$(free_port)
api_port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The consumer: prints each delivery; the first attempt at refs/heads/dev
# gets a 503, so the pump retries it.
start_consumer() {
  python3 -u - "$consumer_port" <<'PY' &
import http.server, json, sys
failed = set()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        d = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        first_dev = d["object"].endswith("/dev") and d["delivery_id"] not in failed
        status = 503 if first_dev else 200
        if first_dev:
            failed.add(d["delivery_id"])
        print(f"   consumer <- delivery {d['delivery_id']}: {d['kind']} of {d['object']}, "
              f"sequence {d['sequence']}, attempt {d['attempt']} -> {status}", flush=True)
        self.send_response(status); self.end_headers()
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
  consumer_pid=$!
  pids+=("$consumer_pid")
  sleep 0.5
}

say "a consumer service 'deploy' on 127.0.0.1:$consumer_port, registered with the producer"
start_consumer
token=$("$bin" services add deploy --base-url "http://127.0.0.1:$consumer_port" | tail -1)

say "the pump and the watches API (producer 'git') on 127.0.0.1:$api_port"
WATCHPUMP_PRODUCER=git WATCHPUMP_PRODUCER_TOKEN=demo-producer-token \
WATCHPUMP_LISTEN="127.0.0.1:$api_port" WATCHPUMP_METRICS_LISTEN=off \
WATCHPUMP_RETRY_INITIAL_MS=2000 WATCHPUMP_PROBE_INTERVAL_MS=500 RUST_LOG=warn \
  "$bin" serve &
pids+=("$!")
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$api_port/healthz" >/dev/null && break; sleep 0.2; done

say "the consumer watches acme/web/ (a prefix: every branch)"
curl -s "http://127.0.0.1:$api_port/api/v1/watches" -H "Authorization: Bearer $token" \
  -H 'Content-Type: application/json' -d '{"resource": "web", "object": "acme/web/"}'
echo

say "the producer records three changes (each in its own transaction)"
for branch in main dev main; do
  echo "   producer: push to acme/web/refs/heads/$branch"
  "$bin" emit "acme/web/refs/heads/$branch" push "{\"after\": \"$RANDOM\"}" >/dev/null
  sleep 0.4
done
echo "   (the first attempt at dev failed with 503: it is retried in about 2 s)"
sleep 3

say "the consumer goes away; two more pushes wait for it"
kill "$consumer_pid"; wait "$consumer_pid" 2>/dev/null || true
for branch in feature-a feature-b; do
  "$bin" emit "acme/web/refs/heads/$branch" push '{}' >/dev/null
done
sleep 2
psql "$DATABASE_URL" -c 'select service, pending, in_flight, due_now, retrying, looks_down from watchpump.backlog'

say "the consumer comes back: its backlog is released at once"
start_consumer
sleep 3
psql "$DATABASE_URL" -c "select delivery_id, object, sequence, state, attempts, last_status
                         from watchpump.delivery_log order by delivery_id"

say "done: the pump stops on SIGTERM (database watchpump_demo stays for a look; make pg-stop stops the cluster)"
