// lane-worker's SQL API, called from Node with the `pg` package the way the
// TypeScript app calls it: the release id a worker serves, submit, an idempotent
// re-submit, signal, status, cancel, a bulk submit, and the refusals an app tests by SQLSTATE. Prints one
// JSON object of what it saw; tests/e2e/test_interop_node.py checks it against the database.
//
// Usage: DATABASE_URL=postgresql://... STORE_SCHEMA=runtime_scheduler node sql_api.mjs
import pg from 'pg';

const schema = process.env.STORE_SCHEMA ?? 'runtime_scheduler';
const api = `"${schema.replaceAll('"', '""')}"`;
const client = new pg.Client({ connectionString: process.env.DATABASE_URL });

// jsonb arguments are sent as JSON text: pg would turn a JS array into a
// Postgres array literal, not JSON.
async function call(fn, ...args) {
  const params = args.map((_, i) => `$${i + 1}`).join(', ');
  const { rows } = await client.query(`select ${api}.${fn}(${params}) as result`, args);
  return rows[0].result;
}

async function refusal(fn, ...args) {
  try {
    await call(fn, ...args);
    return { refused: false };
  } catch (err) {
    return {
      refused: true,
      code: err.code,
      constraint: err.constraint ?? null,
      detail: err.detail ?? null,
      message: err.message,
    };
  }
}

const seen = {};
await client.connect();
try {
  // The release id a worker deployed with DEEPLINE_RUNTIME_DEPLOY_VERSION=rel-node
  // serves (or with DEEPLINE_ABSURD_QUEUE_SUFFIX), so the app never derives it.
  seen.workerRelease = await call('worker_release_id', null, 'rel-node');
  seen.workerPreview = await call('worker_release_id', 'PR 7', 'rel-node');
  seen.workerRefused = await refusal('worker_release_id', null, 'dev-x');
  seen.submitted = await call(
    'submit_run', 'greet', JSON.stringify({ name: 'from-node' }), 'rel-node', 'node-order-1',
    JSON.stringify({ baseUrl: 'https://app.example/api', executorToken: process.env.EXEC_TOKEN }),
  );
  seen.resubmitted = await call(
    'submit_run', 'greet', JSON.stringify({ name: 'from-node' }), 'rel-node', 'node-order-1',
  );
  seen.conflict = await refusal(
    'submit_run', 'greet', JSON.stringify({ name: 'someone else' }), 'rel-node', 'node-order-1',
  );
  seen.badInput = await refusal('submit_run', 'greet', JSON.stringify([1, 2]), 'rel-node');
  seen.badRelease = await refusal('submit_run', 'greet', JSON.stringify({}), '???');
  // What JSON.stringify writes happily and no worker could read back.
  let deep = 1;
  for (let level = 0; level < 3000; level += 1) deep = [deep];
  seen.deepInput = await refusal('submit_run', 'greet', JSON.stringify({ v: deep }), 'rel-node');
  seen.longNumber = await refusal('submit_run', 'greet', `{"n": ${'1'.repeat(5001)}}`, 'rel-node');
  const runId = seen.submitted.runId;
  seen.signalled = await call('signal_run', runId, 'approved', JSON.stringify({ by: 'node' }));
  seen.signalledAgain = await call('signal_run', runId, 'approved', JSON.stringify({ by: 'x' }));
  seen.deepSignal = await refusal('signal_run', runId, 'deep', JSON.stringify(deep));
  seen.status = await call('run_status', runId);
  seen.noSuchRun = await refusal('run_status', '00000000-0000-4000-8000-000000000000');
  seen.noRunner = await refusal('report_runner_result', runId, 1, JSON.stringify({ ok: true }));
  seen.other = await call('submit_run', 'greet', null, 'rel-node');
  seen.cancelled = await call('cancel_run', seen.other.runId, 'changed my mind');
  seen.many = await call('submit_runs', JSON.stringify([
    { play: 'greet', input: { name: 'from-node' }, releaseId: 'rel-node',
      idempotencyKey: 'node-order-1' },
    { play: 'greet', input: { n: 2 }, releaseId: 'rel-node' },
  ]));
  seen.manyRefused = await refusal('submit_runs', JSON.stringify([
    { play: 'greet', releaseId: 'rel-node' }, { play: 'greet', input: [1], releaseId: 'rel-node' },
  ]));
} finally {
  await client.end();
}
process.stdout.write(JSON.stringify(seen) + '\n');
