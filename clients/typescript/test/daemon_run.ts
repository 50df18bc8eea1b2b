// A TypeScript app's round trip with a real worker: submit a run and wait for
// its end; submit a run that waits for an event, signal it, wait for its end;
// submit a run that parks on a detached runner, report the runner's result,
// wait for its end.
// tests/e2e/test_typescript_client.py starts the daemon (release RELEASE_ID,
// the test app support.apps.detached) and checks the store.
//
// Usage: DATABASE_URL=... STORE_SCHEMA=... RELEASE_ID=... node build/test/daemon_run.js
import { setTimeout as sleep } from 'node:timers/promises';

import { LaneClient, WaitTimeoutError, type RunReport } from '../src/index.js';

// Generous: on a loaded machine a worker can take long to start; the test
// fails on what the wait returns, not on how long it took.
const TEN_MINUTES_MS = 600_000;

/** Read the run's status until it is `status` (the runner attempt exists once it parks). */
async function until(client: LaneClient, runId: string, status: string): Promise<RunReport> {
  const deadline = performance.now() + TEN_MINUTES_MS;
  for (;;) {
    const report = await client.status(runId);
    if (report.status === status) return report;
    if (performance.now() > deadline) {
      throw new WaitTimeoutError(`run ${runId} never became ${status}`, report);
    }
    await sleep(50);
  }
}

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
    const detached = await client.submit('detached', {});
    const parked = await until(client, detached.runId, 'waiting');
    const reported = await client.reportRunnerResult(detached.runId, 1, { built: 'from-node' });
    const reportedAgain = await client.reportRunnerResult(detached.runId, 1, { built: 'again' });
    const detachedEnded = await client.wait(detached.runId, { timeoutMs: TEN_MINUTES_MS });
    // The app's own check (issue 31): the worker names its release as the app does.
    const myRelease = process.env.RELEASE_ID ?? '';
    const oneSpelling = [plainEnded, waiterEnded, detachedEnded].every(
      (r) => r.releaseId === myRelease && r.attempts.every((a) => a.releaseId === myRelease),
    );
    return {
      plain, plainEnded, waiter, signalled, waiterEnded,
      detached, parked, reported, reportedAgain, detachedEnded, oneSpelling,
    };
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
