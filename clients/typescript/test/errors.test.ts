// The client's refusals before and without a database: error classes by
// SQLSTATE, masking, names it refuses. (client.test.ts runs against Postgres.)
import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { test } from 'node:test';

import {
  BadInputError,
  IdempotencyConflictError,
  LaneClient,
  LaneError,
  UnknownRunError,
  checkedSchema,
} from '../src/index.js';
import { fromDatabase } from '../src/errors.js';

const PASSWORD = 'pw-5e3f9c1a-never-shown';
const TOKEN = 'token-1f2e3d4c-never-shown';

test('each SQLSTATE of the SQL API maps to its error class, code and message kept', () => {
  const bad = fromDatabase({ code: '22023', message: 'a run\'s input must be a JSON object' }, []);
  assert.ok(bad instanceof BadInputError && bad instanceof LaneError);
  assert.equal(bad.code, '22023');
  assert.equal(bad.message, 'a run\'s input must be a JSON object');
  assert.equal(bad.name, 'BadInputError');

  const runId = '6f1c7a52-8a4e-4d8e-9d55-2f1b0c3e4a5b';
  const conflict = fromDatabase(
    { code: '23505', constraint: 'idempotency_key', detail: runId, message: 'key names run' },
    [],
  );
  assert.ok(conflict instanceof IdempotencyConflictError);
  assert.equal(conflict.existingRunId, runId);
  assert.equal(conflict.code, '23505');

  // Another unique violation is no idempotency conflict.
  const other = fromDatabase({ code: '23505', constraint: 'something_else', message: 'dup' }, []);
  assert.ok(!(other instanceof IdempotencyConflictError));
  assert.equal(other.code, '23505');

  const unknown = fromDatabase({ code: 'P0002', message: 'no run x in store y' }, []);
  assert.ok(unknown instanceof UnknownRunError);

  const rest = fromDatabase({ code: '40001', message: 'try again' }, []);
  assert.equal(rest.constructor, LaneError);
  assert.deepEqual([rest.code, rest.message], ['40001', 'try again']);
});

test('a known secret is masked in the message and the detail', () => {
  const err = fromDatabase(
    { code: 'XX000', message: `echoed ${TOKEN} and ${PASSWORD}`, detail: `again ${TOKEN}` },
    [TOKEN, PASSWORD],
  );
  const shown = `${err.message} ${err.detail} ${inspect(err)} ${JSON.stringify(err)}`;
  assert.ok(!shown.includes(TOKEN) && !shown.includes(PASSWORD), shown);
  assert.equal(err.message, 'echoed *** and ***');
});

test('a connection failure names no password', async () => {
  // Port 1 answers nobody: the connection is refused.
  const client = new LaneClient(`postgresql://app:${PASSWORD}@127.0.0.1:1/db`);
  try {
    await assert.rejects(client.status('6f1c7a52-8a4e-4d8e-9d55-2f1b0c3e4a5b'), (err) => {
      assert.ok(err instanceof LaneError);
      assert.equal(err.code, 'ECONNREFUSED');
      const shown = `${inspect(err)} ${JSON.stringify(err)} ${String(err.stack)}`;
      assert.ok(!shown.includes(PASSWORD), shown);
      return true;
    });
  } finally {
    await client.close();
  }
});

test('a logged client shows no password', async () => {
  const client = new LaneClient(`postgresql://app:${PASSWORD}@127.0.0.1:1/db`);
  try {
    await assert.rejects(client.status('6f1c7a52-8a4e-4d8e-9d55-2f1b0c3e4a5b'));
    const shown = `${inspect(client, { depth: 10, showHidden: true })} ${JSON.stringify(client)}`;
    assert.ok(!shown.includes(PASSWORD), shown);
  } finally {
    await client.close();
  }
});

test('an unusable connection string is refused without echoing it', async () => {
  const client = new LaneClient(`postgresql://app:${PASSWORD}@127.0.0.1:notaport/db`);
  try {
    await assert.rejects(client.status('6f1c7a52-8a4e-4d8e-9d55-2f1b0c3e4a5b'), (err) => {
      assert.ok(err instanceof LaneError);
      const shown = `${inspect(err)} ${JSON.stringify(err)} ${String(err.stack)}`;
      assert.ok(!shown.includes(PASSWORD), shown);
      return true;
    });
  } finally {
    await client.close();
  }
});

test('a missing connection string or pool is refused in one sentence', () => {
  for (const [db, says] of [
    [undefined, /got undefined\.$/],
    [null, /got null\.$/],
    ['', /got a blank one\.$/],
    ['  ', /got a blank one\.$/],
    [{}, /got object\.$/],
  ] as const) {
    assert.throws(() => new LaneClient(db as never), (err) => {
      assert.ok(err instanceof BadInputError);
      assert.match(err.message, /^LaneClient needs a connection string/);
      assert.match(err.message, says);
      return true;
    });
  }
});

test('the store schema must be a plain lower-case name of its own', () => {
  assert.equal(checkedSchema('lane_worker_store'), 'lane_worker_store');
  for (const bad of ['Runtime', 'a"b', 'x; drop table runs', '1abc', '', 'public', 'absurd',
    'lane_worker', 'pg_catalog', 'a'.repeat(64)]) {
    assert.throws(() => new LaneClient('postgresql://localhost/db', { schema: bad }),
      (err) => err instanceof BadInputError && err.code === undefined, bad);
  }
});

test('a run id that is no UUID, a runner attempt that is no whole number: refused', async () => {
  // Nothing answers on port 1: a refusal before sending is the only way to pass.
  const client = new LaneClient('postgresql://127.0.0.1:1/db');
  try {
    await assert.rejects(client.status('not-a-run'), BadInputError);
    await assert.rejects(client.cancel('123'), BadInputError);
    await assert.rejects(
      client.reportRunnerResult('6f1c7a52-8a4e-4d8e-9d55-2f1b0c3e4a5b', 1.5), BadInputError);
    await assert.rejects(
      client.reportRunnerResult('6f1c7a52-8a4e-4d8e-9d55-2f1b0c3e4a5b', 0), BadInputError);
    const circular: Record<string, unknown> = { token: TOKEN };
    circular.self = circular;
    await assert.rejects(client.submit('p', circular as never, { releaseId: 'r' }), (err) => {
      assert.ok(err instanceof BadInputError);
      assert.match(err.message, /^submit_run's argument 2 cannot be sent as JSON: /);
      assert.ok(!err.message.includes(TOKEN));
      return true;
    });
  } finally {
    await client.close();
  }
});
