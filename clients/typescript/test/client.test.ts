// Every call of the client against a real, migrated store (`lane-worker
// migrate`): DATABASE_URL names the database, STORE_SCHEMA its store schema
// (default runtime_scheduler). tests/e2e/test_typescript_client.py runs this
// file on a fresh database of the Python suite; `npm test` on any other.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import { after, test } from 'node:test';

import pg from 'pg';

import {
  BadInputError,
  IdempotencyConflictError,
  LaneClient,
  LaneError,
  UnknownRunError,
  WaitTimeoutError,
  type RunReport,
} from '../src/index.js';

const url = process.env.DATABASE_URL;
if (url === undefined || url === '') throw new Error('set DATABASE_URL to a migrated database');
const schema = process.env.STORE_SCHEMA ?? 'runtime_scheduler';
// Each run of this file has its own release (lane) and keys: the database may be shared.
const tag = randomUUID().slice(0, 8);
const release = `rel-ts-${tag}`;
const client = new LaneClient(url, { schema, releaseId: release, pollIntervalMs: 20 });
const NOBODY = '00000000-0000-4000-8000-000000000000';
const TOKEN = `exec-token-${randomUUID()}`;

after(() => client.close());

/** Each result carries exactly the fields its interface declares (types.ts). */
function assertFields(value: object, fields: string[]): void {
  assert.deepEqual(Object.keys(value).sort(), [...fields].sort());
}

test('submit answers the run and its lane; a repeat of the key answers the same run', async () => {
  const run = await client.submit('greet', { name: 'ada' }, { idempotencyKey: `k-${tag}-1` });
  assertFields(run, ['runId', 'queue', 'releaseId', 'created', 'served', 'warning']);
  assert.deepEqual(run, {
    runId: run.runId, queue: `runs_rel_ts_${tag}`, releaseId: release, created: true,
    served: false, warning: run.warning,
  });
  // No worker of this lane ever registered: the run is kept, and the caller is told.
  assert.match(String(run.warning), new RegExp(`^no worker serves lane runs_rel_ts_${tag} `));
  const again = await client.submit('greet', { name: 'ada' }, { idempotencyKey: `k-${tag}-1` });
  assert.deepEqual(again, { ...run, created: false });
  await assert.rejects(
    client.submit('greet', { name: 'bob' }, { idempotencyKey: `k-${tag}-1` }),
    (err) => {
      assert.ok(err instanceof IdempotencyConflictError);
      assert.equal(err.existingRunId, run.runId);
      assert.match(err.message, /this submit differs in its input/);
      return true;
    },
  );
});

test('a request the API refuses is a BadInputError with the reason', async () => {
  await assert.rejects(client.submit('greet', [1, 2] as never), (err) => {
    assert.ok(err instanceof BadInputError);
    assert.equal(err.code, '22023');
    assert.match(err.message, /must be a JSON object, not a JSON array/);
    return true;
  });
  await assert.rejects(client.submit('greet', {}, { releaseId: '???' }), BadInputError);
  await assert.rejects(client.submit('greet', {}, { maxAttempts: 0 }), BadInputError);
  // No release given anywhere: the client says where one goes, before any call.
  const bare = new LaneClient(url, { schema });
  try {
    await assert.rejects(bare.submit('greet', {}), (err) => {
      assert.ok(err instanceof BadInputError);
      assert.match(err.message, /pass \{ releaseId \} to new LaneClient/);
      assert.match(err.message, /workerReleaseId\(\)/);
      return true;
    });
    await assert.rejects(bare.submitMany([{ play: 'greet' }]), /^BadInputError: item 0: a submit/);
  } finally {
    await bare.close();
  }
});

test('a runtime API refused never shows its token', async () => {
  await assert.rejects(
    client.submit('greet', {}, {
      runtimeApi: { baseUrl: 'ftp://app.example', executorToken: TOKEN },
    }),
    (err) => {
      assert.ok(err instanceof BadInputError);
      assert.match(err.message, /baseUrl must be an http:\/\/ or https:\/\/ URL/);
      assert.ok(!`${inspect(err)} ${JSON.stringify(err)}`.includes(TOKEN));
      return true;
    },
  );
});

test('signal, status, cancel and wait, with their results', async () => {
  const run = await client.submit('approval', { order: 'A-7' });
  const signalled = await client.signal(run.runId, 'approved', { by: 'ada' });
  assertFields(signalled, [
    'runId', 'eventKey', 'delivered', 'duplicate', 'runEnded', 'deliveredTo', 'keptForRetry',
  ]);
  assert.deepEqual(signalled, {
    runId: run.runId, eventKey: 'approved', delivered: true, duplicate: false, runEnded: null,
    deliveredTo: run.runId, keptForRetry: false,
  });
  const again = await client.signal(run.runId, 'approved');
  assert.equal(again.duplicate, true);

  const report = await client.status(run.runId);
  assertFields(report, [
    'runId', 'play', 'status', 'releaseId', 'adoptedReleaseId', 'queue', 'attempts', 'output',
    'error', 'retryOf', 'steps', 'facts', 'attemptCount', 'maxAttempts', 'claims',
  ]);
  assert.equal(report.status, 'queued');
  // Store 0036: the attempts spent, of how many; the claims (none yet) as a list.
  assert.deepEqual([report.attemptCount, report.claims], [0, []]);
  assert.equal(report.releaseId, release);

  // Nothing serves this lane: the run stays queued and the wait gives up.
  await assert.rejects(client.wait(run.runId, { timeoutMs: 0 }), (err) => {
    assert.ok(err instanceof WaitTimeoutError);
    assert.equal(err.last.status, 'queued');
    return true;
  });
  const controller = new AbortController();
  controller.abort(new Error('caller gave up'));
  await assert.rejects(
    client.wait(run.runId, { timeoutMs: 60_000, signal: controller.signal }), /caller gave up/);

  const cancelled = await client.cancel(run.runId, 'customer withdrew');
  assertFields(cancelled, ['runId', 'cancelled', 'status']);
  assert.deepEqual(cancelled, { runId: run.runId, cancelled: true, status: 'cancelled' });
  assert.deepEqual(await client.cancel(run.runId), {
    runId: run.runId, cancelled: false, status: 'cancelled',
  });
  const ended: RunReport = await client.wait(run.runId, { timeoutMs: 60_000 });
  assert.equal(ended.status, 'cancelled');
  assert.deepEqual(ended.facts.map((f) => f.type), ['run.cancelled']);
  const late = await client.signal(run.runId, 'late');
  assert.deepEqual([late.runEnded, late.keptForRetry], ['cancelled', true]);
});

test('an unknown run is an UnknownRunError for every call', async () => {
  for (const call of [
    () => client.status(NOBODY),
    () => client.cancel(NOBODY),
    () => client.signal(NOBODY, 'x'),
    () => client.wait(NOBODY, { timeoutMs: 60_000 }),
    () => client.reportRunnerResult(NOBODY, 1, { ok: true }),
  ]) {
    await assert.rejects(call(), (err) => err instanceof UnknownRunError && err.code === 'P0002');
  }
  const run = await client.submit('greet', {});
  await assert.rejects(client.reportRunnerResult(run.runId, 1, { ok: true }), (err) => {
    assert.ok(err instanceof UnknownRunError);
    assert.match(err.message, /has no runner attempt 1/);
    return true;
  });
});

test('submitMany submits all in one transaction, or none with the item named', async () => {
  const runs = await client.submitMany([
    { play: 'greet', input: { n: 1 }, idempotencyKey: `k-${tag}-many` },
    { play: 'greet', input: { n: 2 }, releaseId: `${release}-b` },
    { play: 'greet', input: { n: 1 }, idempotencyKey: `k-${tag}-many` },
  ]);
  assert.equal(runs.length, 3);
  runs.forEach((run) => assertFields(run, ['runId', 'queue', 'releaseId', 'created', 'served',
    'warning']));
  assert.deepEqual(runs.map((r) => [r.releaseId, r.created]), [
    [release, true], [`${release}-b`, true], [release, false],
  ]);
  assert.equal(runs[2]?.runId, runs[0]?.runId);
  assert.deepEqual(await client.submitMany([]), []);
  await assert.rejects(
    client.submitMany([{ play: 'greet' }, { play: 'greet', input: [1] as never }]),
    (err) => {
      assert.ok(err instanceof BadInputError);
      assert.match(err.message, /^item 1: a run's input must be a JSON object/);
      return true;
    },
  );
});

test('a pg Pool or Client of the app is used as it is and left open', async () => {
  const pool = new pg.Pool({ connectionString: url });
  const own = new pg.Client({ connectionString: url });
  await own.connect();
  try {
    for (const db of [pool, own]) {
      const viaApp = new LaneClient(db, { schema, releaseId: release });
      const run = await viaApp.submit('greet', {});
      assert.equal((await viaApp.status(run.runId)).status, 'queued');
      await viaApp.close();
    }
    const { rows } = await pool.query('select 1 as one');
    assert.deepEqual(rows, [{ one: 1 }]); // close() left the app's pool open
  } finally {
    await own.end();
    await pool.end();
  }
});

test('a schema without the SQL API is a LaneError with the SQLSTATE', async () => {
  const elsewhere = new LaneClient(url, { schema: `no_store_${tag}` });
  try {
    await assert.rejects(elsewhere.status(NOBODY), (err) => {
      assert.ok(err instanceof LaneError);
      assert.equal(err.code, '3F000'); // invalid_schema_name
      return true;
    });
  } finally {
    await elsewhere.close();
  }
});

test('callFunction reaches any SQL API function by name, with the typed errors', async () => {
  const queue = await client.callFunction<string>('queue_for_release', ['text'], ['dev-Feature X']);
  assert.equal(queue, 'runs_feature_x');
  await assert.rejects(client.callFunction('run_status; drop', [], []), BadInputError);
  await assert.rejects(client.callFunction('run_status', ['uuid'], [NOBODY]), UnknownRunError);
});

test('workerReleaseId answers the release a worker so started serves, by its own rules', async () => {
  const deployed = await client.workerReleaseId(null, ` ${release} `);
  assertFields(deployed, ['releaseId', 'queue']);
  assert.deepEqual(deployed, { releaseId: release, queue: `runs_rel_ts_${tag}` });
  assert.deepEqual(await client.workerReleaseId('Feature/Login', release),
    { releaseId: 'dev-feature_login', queue: 'runs_feature_login' });
  assert.deepEqual(await client.workerReleaseId(), { releaseId: 'dev', queue: 'runs' });
  await assert.rejects(client.workerReleaseId(null, 'dev-x'), (err) => {
    assert.ok(err instanceof BadInputError);
    assert.match(err.message, /spelled like a dev lane/);
    return true;
  });
});
