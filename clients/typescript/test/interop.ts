// Every call of the SQL API through the client, as a TypeScript app makes
// them: submit, an idempotent re-submit, signal, status, cancel, a bulk
// submit, a runner result, and the refusals an app catches by class. Prints
// one JSON object of what it saw; tests/e2e/test_typescript_client.py checks
// it against the rows in the store.
//
// Usage: DATABASE_URL=postgresql://... STORE_SCHEMA=runtime_scheduler EXEC_TOKEN=... \
//          node build/test/interop.js
import { LaneClient, LaneError, IdempotencyConflictError } from '../src/index.js';

const client = new LaneClient(process.env.DATABASE_URL ?? '', {
  schema: process.env.STORE_SCHEMA ?? 'runtime_scheduler',
  releaseId: 'rel-node',
});

interface Refusal {
  refused: boolean;
  error?: string;
  code?: string | undefined;
  existingRunId?: string;
  message?: string;
}

async function refusal(call: () => Promise<unknown>): Promise<Refusal> {
  try {
    await call();
    return { refused: false };
  } catch (err) {
    if (!(err instanceof LaneError)) throw err;
    return {
      refused: true,
      error: err.name,
      code: err.code,
      ...(err instanceof IdempotencyConflictError ? { existingRunId: err.existingRunId } : {}),
      message: err.message,
    };
  }
}

async function main(): Promise<Record<string, unknown>> {
  const seen: Record<string, unknown> = {};
  try {
    // The release id a worker deployed with DEEPLINE_RUNTIME_DEPLOY_VERSION=rel-node (or
    // with DEEPLINE_ABSURD_QUEUE_SUFFIX) serves: the app asks instead of deriving it.
    seen.workerRelease = await client.workerReleaseId(null, 'rel-node');
    seen.workerPreview = await client.workerReleaseId('PR 7', 'rel-node');
    seen.workerRefused = await refusal(() => client.workerReleaseId(null, 'dev-x'));
    const submitted = await client.submit('greet', { name: 'from-node' }, {
      idempotencyKey: 'node-order-1',
      runtimeApi: {
        baseUrl: 'https://app.example/api', executorToken: process.env.EXEC_TOKEN ?? '',
      },
    });
    seen.submitted = submitted;
    seen.resubmitted = await client.submit('greet', { name: 'from-node' }, {
      idempotencyKey: 'node-order-1',
    });
    seen.conflict = await refusal(() =>
      client.submit('greet', { name: 'someone else' }, { idempotencyKey: 'node-order-1' }));
    seen.badInput = await refusal(() => client.submit('greet', [1, 2] as never));
    seen.badRelease = await refusal(() => client.submit('greet', {}, { releaseId: '???' }));
    // What JSON.stringify writes happily and no worker could read back.
    let deep: unknown = 1;
    for (let level = 0; level < 3000; level += 1) deep = [deep];
    seen.deepInput = await refusal(() => client.submit('greet', { v: deep } as never));
    const runId = submitted.runId;
    seen.signalled = await client.signal(runId, 'approved', { by: 'node' });
    seen.signalledAgain = await client.signal(runId, 'approved', { by: 'x' });
    seen.deepSignal = await refusal(() => client.signal(runId, 'deep', deep as never));
    seen.status = await client.status(runId);
    seen.noSuchRun = await refusal(() => client.status('00000000-0000-4000-8000-000000000000'));
    seen.noRunner = await refusal(() => client.reportRunnerResult(runId, 1, { ok: true }));
    seen.other = await client.submit('greet');
    const other = (seen.other as { runId: string }).runId;
    seen.cancelled = await client.cancel(other, 'changed my mind');
    seen.many = await client.submitMany([
      { play: 'greet', input: { name: 'from-node' }, idempotencyKey: 'node-order-1' },
      { play: 'greet', input: { n: 2 } },
    ]);
    seen.manyRefused = await refusal(() =>
      client.submitMany([{ play: 'greet' }, { play: 'greet', input: [1] as never }]));
  } finally {
    await client.close();
  }
  return seen;
}

main().then(
  (seen) => process.stdout.write(JSON.stringify(seen) + '\n'),
  (err: unknown) => {
    process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 1;
  },
);
