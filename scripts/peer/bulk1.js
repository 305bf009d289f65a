// The peer of BENCHMARKS.md's comparison: graphile-worker delivering
// bench's bulk-1 workload. `make bench SCENARIOS=peer` runs it (after
// `npm ci --prefix scripts/peer`); it is not run on its own.
//
// DATABASE_URL, CONSUMER_URL and JOBS from the environment. It installs
// graphile-worker's schema, adds JOBS jobs in one transaction with
// add_jobs() (each job the body of a bulk-1 delivery), prints "added",
// then runs a worker that POSTs each job's body, signed with HMAC-SHA256
// as watchpump signs (Standard Webhooks), to CONSUMER_URL over a
// keep-alive agent, until the bench kills it. The settings are the
// fastest of the trial runs of the earlier comparison (BENCHMARKS.md,
// "Against the peer").
const crypto = require("node:crypto");
const http = require("node:http");
const { Logger, run, runMigrations } = require("graphile-worker");
const { Pool } = require("pg");

const connectionString = process.env.DATABASE_URL;
const consumer = new URL(process.env.CONSUMER_URL + "/api/v1/git/events");
const jobs = Number(process.env.JOBS || 20000);
const concurrency = 50;
const secret = crypto.randomBytes(32);
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
// Errors only, on stderr: a line a job would cost the worker CPU that
// watchpump's pump does not spend (it logs no delivery at its default
// level), and stdout is the bench's.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

function post(body) {
  const id = `msg_${crypto.randomUUID()}`;
  const ts = Math.floor(Date.now() / 1000).toString();
  const sig = crypto.createHmac("sha256", secret).update(`${id}.${ts}.${body}`).digest("base64");
  return new Promise((resolve, reject) => {
    const req = http.request(
      consumer,
      {
        method: "POST",
        agent,
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
          "webhook-id": id,
          "webhook-timestamp": ts,
          "webhook-signature": `v1,${sig}`,
        },
      },
      (res) => {
        res.resume();
        res.on("end", () =>
          res.statusCode >= 200 && res.statusCode < 300
            ? resolve()
            : reject(new Error(`HTTP ${res.statusCode}`)),
        );
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function main() {
  await runMigrations({ connectionString, logger });
  const pool = new Pool({ connectionString, max: 1 });
  // One transaction, as bulk-1 emits its 20,000 changes in one.
  await pool.query(
    `select count(*) from graphile_worker.add_jobs(array(
       select row('deliver', json_build_object(
                'delivery_id', n, 'change_id', n, 'watch_id', 1, 'producer', 'git',
                'resource', 'r', 'object', 'acme/repo/refs/heads/b' || n, 'kind', 'push',
                'sequence', 1, 'occurred_at', now(), 'attempt', 1,
                'payload', json_build_object('after', '9f2c1e', 'paths', json_build_array('src/main.rs'))),
              null, null, null, null, null, null)::graphile_worker.job_spec
       from generate_series(1, $1::int) n))`,
    [jobs],
  );
  await pool.end();
  console.log("added");
  await run({
    connectionString,
    noHandleSignals: false,
    logger,
    taskList: {
      deliver: async (payload) => post(JSON.stringify(payload)),
    },
    preset: {
      worker: {
        concurrentJobs: concurrency,
        maxPoolSize: concurrency,
        localQueue: { size: 500 },
        completeJobBatchDelay: 5,
        failJobBatchDelay: 5,
        pollInterval: 1000,
      },
    },
  });
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
