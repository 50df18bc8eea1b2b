// A TypeScript app's round trip with a real worker: submit a run and wait for
// its end; submit a run that waits for an event, signal it, wait for its end.
// tests/e2e/test_typescript_client.py starts the daemon (release RELEASE_ID,
// the test app support.apps.basic) and checks the store.
//
// Usage: DATABASE_URL=... STORE_SCHEMA=... RELEASE_ID=... node build/test/daemon_run.js
import { LaneClient } from '../src/index.js';

// Generous: on a loaded machine a worker can take long to start; the test
// fails on what the wait returns, not on how long it took.
const TEN_MINUTES_MS = 600_000;

async function main(): Promise<Record<string, unknown>> {
  const client = new LaneClient(process.env.DATABASE_URL ?? '', {
    schema: process.env.STORE_SCHEMA ?? 'runtime_scheduler',
    releaseId: process.env.RELEASE_ID ?? '',
  });
  try {
    const plain = await client.submit('plain', { hello: 'from-node' });
    const plainEnded = await client.wait(plain.runId, { timeoutMs: TEN_MINUTES_MS });
    const waiter = await client.submit('waiter', {});
    const signalled = await client.signal(waiter.runId, 'go', { by: 'node' });
    const waiterEnded = await client.wait(waiter.runId, { timeoutMs: TEN_MINUTES_MS });
    return { plain, plainEnded, waiter, signalled, waiterEnded };
  } finally {
    await client.close();
  }
}

main().then(
  (seen) => process.stdout.write(JSON.stringify(seen) + '\n'),
  (err: unknown) => {
    process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 1;
  },
);
