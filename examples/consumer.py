#!/usr/bin/env python3
"""A watchpump consumer in Python, standard library only (docs/protocol.md).

It does what every consumer should:

1. verifies each delivery's Standard Webhooks signature over the raw body,
   with the service's signing secret, and refuses a stale timestamp (401);
2. stores the delivery id, in the same SQLite transaction as its work, and
   answers 200 to a delivery id it already has (deliveries come at least
   once);
3. ignores a sequence lower than (or equal to) one it stored for the same
   (watch, object): the object is already newer here;
4. answers 410 for a resource that is gone, so the producer drops the watch;
5. answers 2xx only once the work is committed.

Its "work" is keeping the newest payload of each (resource, object) in the
table `state`. Run it (with `make run` running and a service registered with
`watchpump services add NAME --base-url http://127.0.0.1:9000 --json`):

    WHSEC=whsec_... python3 examples/consumer.py --port 9000 --db target/consumer.db

Options: --port, --db (SQLite file), --producer (default git: the path is
/api/v1/<producer>/events), --gone RESOURCE (answer 410 for it; repeatable).
The signing secret comes from the environment (WHSEC), not the command line,
where other users of the machine could read it in the process list.
"""

import argparse
import base64
import hashlib
import hmac
import http.server
import json
import os
import sqlite3
import sys
import time

TOLERANCE_SECS = 5 * 60  # refuse timestamps further than this from our clock
MAX_BODY = 16 * 1024 * 1024  # a delivery larger than this is refused (413)


def verify(secret, headers, body):
    """True when one of the `v1,` signatures is the HMAC of this delivery."""
    msg_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    if not msg_id or not timestamp.isdigit():
        return False
    if abs(time.time() - int(timestamp)) > TOLERANCE_SECS:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(expected, sig.removeprefix("v1,"))
        for sig in headers.get("webhook-signature", "").split()
        if sig.startswith("v1,")
    )


SCHEMA = """
create table if not exists deliveries (delivery_id integer primary key, outcome text not null);
create table if not exists sequences (watch_id integer, object text, sequence integer not null,
                                      primary key (watch_id, object));
create table if not exists state (resource text, object text, kind text, payload text,
                                  sequence integer, primary key (resource, object));
"""


def handle(db, d, gone):
    """Applies one verified delivery in one transaction; returns (status, outcome)."""
    if d["resource"] in gone:
        return 410, "gone"
    with db:  # one transaction: commits on success, rolls back on an exception
        if db.execute("select 1 from deliveries where delivery_id = ?", (d["delivery_id"],)).fetchone():
            return 200, "duplicate"
        row = db.execute("select sequence from sequences where watch_id = ? and object = ?",
                         (d["watch_id"], d["object"])).fetchone()
        if row and d["sequence"] <= row[0]:
            outcome = "stale"
        else:
            outcome = "applied"
            db.execute("insert or replace into sequences values (?, ?, ?)",
                       (d["watch_id"], d["object"], d["sequence"]))
            db.execute("insert or replace into state values (?, ?, ?, ?, ?)",
                       (d["resource"], d["object"], d["kind"], json.dumps(d["payload"]), d["sequence"]))
        db.execute("insert into deliveries values (?, ?)", (d["delivery_id"], outcome))
    return 200, outcome


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--port", type=int, default=9000)
    args.add_argument("--db", default="consumer.db")
    args.add_argument("--producer", default="git")
    args.add_argument("--gone", action="append", default=[])
    opts = args.parse_args()
    secret = os.environ.get("WHSEC", "")
    if not secret.startswith("whsec_"):
        sys.exit("consumer: set WHSEC to the service's signing secret (whsec_...)")
    db = sqlite3.connect(opts.db)
    db.executescript(SCHEMA)
    path = f"/api/v1/{opts.producer}/events"

    class Events(http.server.BaseHTTPRequestHandler):
        def answer(self, status, outcome):
            self.send_response(status)
            self.end_headers()
            print(f"{status} {outcome} delivery={self.headers.get('webhook-id')}", flush=True)

        def do_POST(self):
            if self.path != path:
                return self.answer(404, "no such endpoint")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self.answer(413, "too large")
            body = self.rfile.read(length)
            if not verify(secret, self.headers, body):
                return self.answer(401, "forged or stale: refused")
            d = json.loads(body)
            status, outcome = handle(db, d, set(opts.gone))
            self.answer(status, f"{outcome} {d['kind']} of {d['object']} for {d['resource']}, "
                                f"sequence {d['sequence']}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", opts.port), Events)
    print(f"consumer listening on http://127.0.0.1:{opts.port}{path}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
