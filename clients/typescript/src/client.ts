// LaneClient: lane-worker's SQL API (store migrations 0008, 0009, 0010, 0025)
// from TypeScript over pg. Each method is one call of one SQL function, one
// transaction on the server; the rules (lanes, idempotency, limits) live
// there, once, for every language. jsonb arguments go as JSON text with an
// explicit cast: pg would send a JS array as a Postgres array literal.

import { setTimeout as sleep } from 'node:timers/promises';

import pg from 'pg';

import { BadInputError, WaitTimeoutError, fromDatabase } from './errors.js';
import {
  isTerminal,
  type CancelResult,
  type JsonObject,
  type JsonValue,
  type RunReport,
  type RunnerReport,
  type RuntimeApi,
  type SignalResult,
  type SubmitRequest,
  type SubmittedRun,
  type WorkerRelease,
} from './types.js';

/** What the client queries through: a pg Pool, Client or PoolClient. */
export interface Queryable {
  query(text: string, values: unknown[]): Promise<{ rows: unknown[] }>;
}

export interface LaneClientOptions {
  /** The store schema the SQL API lives in (`LANE_WORKER_STORE_SCHEMA` of the workers). */
  schema?: string | undefined;
  /** The release `submit` uses when a request names none (e.g. your deploy version). */
  releaseId?: string | undefined;
  /** How often `wait` reads the run's status, in milliseconds (default 200). */
  pollIntervalMs?: number | undefined;
}

export interface WaitOptions {
  /** Give up after this many milliseconds: `wait` then throws WaitTimeoutError. */
  timeoutMs: number;
  /** Overrides the client's `pollIntervalMs` for this wait. */
  pollIntervalMs?: number | undefined;
  /** Aborts the wait (it rejects with the signal's reason). */
  signal?: AbortSignal | undefined;
}

/** The SQL types the API's arguments are sent as. */
export type SqlType = 'text' | 'jsonb' | 'uuid' | 'integer';

export const DEFAULT_SCHEMA = 'runtime_scheduler';
const DEFAULT_POLL_MS = 200;

// The workers' rule (worker/config/topology.py): lower case, as Postgres folds
// an unquoted name; at most 63 bytes; not a schema of the engine or Postgres.
const SCHEMA_NAME = /^[a-z_][a-z0-9_]*$/;
const RESERVED_SCHEMAS = new Set(['absurd', 'lane_worker', 'public', 'information_schema']);
const FUNCTION_NAME = /^[a-z_][a-z0-9_]*$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Return `schema` when it is a usable store schema name; else throw BadInputError. */
export function checkedSchema(schema: string): string {
  if (typeof schema !== 'string' || !SCHEMA_NAME.test(schema)) {
    throw new BadInputError(
      `store schema ${JSON.stringify(String(schema)).slice(0, 80)} is not usable: ` +
        'it must be lower-case letters, digits and underscores, not starting with a digit.',
    );
  }
  if (Buffer.byteLength(schema) > 63 || RESERVED_SCHEMAS.has(schema) || schema.startsWith('pg_')) {
    throw new BadInputError(
      `store schema "${schema.slice(0, 63)}" is not usable: it must be at most 63 characters ` +
        'and not absurd, lane_worker, public, information_schema or pg_*.',
    );
  }
  return schema;
}

/** Return the secrets of a connection string: its password and the string itself. */
function connectionSecrets(connectionString: string): string[] {
  const secrets = [connectionString];
  try {
    const password = new URL(connectionString).password;
    if (password !== '') {
      secrets.push(password);
      secrets.push(decodeURIComponent(password));
    }
  } catch {
    // Not a URL, or a password that decodes to nothing: what was found stays masked.
  }
  return secrets;
}

function runtimeApiSecrets(api: RuntimeApi | null | undefined): string[] {
  if (api === null || api === undefined) return [];
  return [api.executorToken, api.vercelProtectionBypassToken].filter(
    (token): token is string => typeof token === 'string',
  );
}

function checkedRunId(runId: string): string {
  if (typeof runId !== 'string' || !UUID.test(runId)) {
    throw new BadInputError(
      `run id ${JSON.stringify(String(runId)).slice(0, 80)} is not a UUID.`,
    );
  }
  return runId;
}

/** The JSON text of `value`, or SQL null for undefined or null. */
function jsonText(value: unknown, what: string): string | null {
  if (value === undefined || value === null) return null;
  try {
    return JSON.stringify(value);
  } catch (err) {
    // JSON.stringify's reasons (a circle, a BigInt) name a type or a property, not a value.
    const reason = err instanceof Error ? err.message.split('\n')[0] : 'it is not JSON';
    throw new BadInputError(`${what} cannot be sent as JSON: ${reason}`);
  }
}

export class LaneClient {
  readonly schema: string;
  readonly releaseId: string | undefined;
  readonly pollIntervalMs: number;
  // Private in JavaScript too (#): a logged client shows neither the connection
  // string nor the pool's options.
  readonly #db: Queryable;
  readonly #ownPool: pg.Pool | undefined;
  readonly #secrets: string[];

  /**
   * A client over `db`: a pg Pool (or Client) you own and end, or a connection
   * string, for which the client opens a Pool that `close()` ends.
   */
  constructor(db: Queryable | string, options: LaneClientOptions = {}) {
    this.schema = checkedSchema(options.schema ?? DEFAULT_SCHEMA);
    this.releaseId = options.releaseId;
    this.pollIntervalMs = options.pollIntervalMs ?? DEFAULT_POLL_MS;
    if (typeof db === 'string') {
      if (db.trim() === '') {
        // pg would quietly fall back to PGHOST or localhost: an unset variable shows here.
        throw new BadInputError(
          'LaneClient needs a connection string (postgresql://...), got a blank one.',
        );
      }
      this.#secrets = connectionSecrets(db);
      this.#ownPool = new pg.Pool({ connectionString: db });
      // An idle connection that breaks is dropped by the pool and the next query
      // opens another; without a listener Node would end the process instead.
      this.#ownPool.on('error', () => undefined);
      this.#db = this.#ownPool;
    } else {
      if (typeof (db as Partial<Queryable> | null | undefined)?.query !== 'function') {
        throw new BadInputError(
          'LaneClient needs a connection string or a pg Pool or Client, ' +
            `got ${db === null ? 'null' : typeof db}.`,
        );
      }
      this.#secrets = [];
      this.#ownPool = undefined;
      this.#db = db;
    }
  }

  /** End the pool the client opened for a connection string (a given pool is yours to end). */
  async close(): Promise<void> {
    await this.#ownPool?.end();
  }

  /**
   * Call SQL API function `fn` of the store schema with `values`, each sent as
   * the SQL type at the same position of `types` (a jsonb value as its JSON
   * text; undefined or null as SQL null), and return its result (a jsonb one
   * parsed). Every
   * method below is one such call; a function this client has no method for
   * yet is reachable the same way, with the same typed errors.
   */
  async callFunction<T>(
    fn: string,
    types: readonly SqlType[],
    values: readonly unknown[],
    secrets: readonly string[] = [],
  ): Promise<T> {
    if (!FUNCTION_NAME.test(fn)) {
      throw new BadInputError(`${JSON.stringify(fn).slice(0, 80)} is not a SQL API function name.`);
    }
    if (types.length !== values.length) {
      throw new BadInputError(`${fn} was given ${values.length} values for ${types.length} types.`);
    }
    const params = types.map((type, i) => `$${i + 1}::${type}`).join(', ');
    const sent = values.map((value, i) =>
      types[i] === 'jsonb' ? jsonText(value, `${fn}'s argument ${i + 1}`) : (value ?? null),
    );
    try {
      const { rows } = await this.#db.query(
        `select "${this.schema}".${fn}(${params}) as result`,
        sent,
      );
      return (rows[0] as { result: T }).result;
    } catch (err) {
      throw fromDatabase(err, [...this.#secrets, ...secrets]);
    }
  }

  /** Submit a run of `play` with `input` (`submit_run`); a repeat of its key answers its run. */
  async submit(
    play: string,
    input?: JsonObject | null,
    options: Omit<SubmitRequest, 'play' | 'input'> = {},
  ): Promise<SubmittedRun> {
    return this.callFunction<SubmittedRun>(
      'submit_run',
      ['text', 'jsonb', 'text', 'text', 'jsonb', 'integer'],
      [
        play,
        input,
        this.#releaseOf(options.releaseId, ''),
        options.idempotencyKey,
        options.runtimeApi,
        options.maxAttempts,
      ],
      runtimeApiSecrets(options.runtimeApi),
    );
  }

  // The release a submit names: its own, else the client's. Neither: say where one goes,
  // rather than the store's bare "a release lane needs a non-empty release id".
  #releaseOf(given: string | undefined, where: string): string {
    const releaseId = given ?? this.releaseId;
    if (releaseId === undefined || releaseId === null) {
      throw new BadInputError(
        `${where}a submit needs the release id of the worker that is to run it: pass ` +
          `{ releaseId } to new LaneClient(...) or to this call (a deploy's ` +
          `DEEPLINE_RUNTIME_DEPLOY_VERSION, or what workerReleaseId() returns for a ` +
          `worktree's DEEPLINE_ABSURD_QUEUE_SUFFIX)`,
        '22023',
      );
    }
    return releaseId;
  }

  /**
   * Submit every request in one transaction, all or none (`submit_runs`); one
   * result per request, in order. A refusal's message starts `item N: ` (0-based).
   */
  async submitMany(requests: readonly SubmitRequest[]): Promise<SubmittedRun[]> {
    const items = requests.map((request, index) => ({
      ...request,
      releaseId: this.#releaseOf(request.releaseId, `item ${index}: `),
    }));
    return this.callFunction<SubmittedRun[]>(
      'submit_runs',
      ['jsonb'],
      [items],
      requests.flatMap((request) => runtimeApiSecrets(request.runtimeApi)),
    );
  }

  /** Deliver event `eventKey` (with `payload`) to a run (`signal_run`); the first delivery wins. */
  async signal(runId: string, eventKey: string, payload?: JsonValue): Promise<SignalResult> {
    return this.callFunction<SignalResult>(
      'signal_run',
      ['uuid', 'text', 'jsonb'],
      [checkedRunId(runId), eventKey, payload],
    );
  }

  /** Cancel a run (`cancel_run`); a run that already ended stays as it is (`cancelled: false`). */
  async cancel(runId: string, reason?: string): Promise<CancelResult> {
    return this.callFunction<CancelResult>(
      'cancel_run',
      ['uuid', 'text'],
      [checkedRunId(runId), reason],
    );
  }

  /** A run's status, attempts, output or error, steps and facts (`run_status`). */
  async status(runId: string): Promise<RunReport> {
    return this.callFunction<RunReport>('run_status', ['uuid'], [checkedRunId(runId)]);
  }

  /**
   * Wait until the run ends (completed, failed or cancelled) and return its
   * status. It polls `run_status` every `pollIntervalMs` (the store sends no
   * notification when a run ends); after `timeoutMs` without an end it throws
   * WaitTimeoutError carrying the last status read.
   */
  async wait(runId: string, options: WaitOptions): Promise<RunReport> {
    const pollMs = options.pollIntervalMs ?? this.pollIntervalMs;
    if (!(options.timeoutMs >= 0) || !(pollMs > 0)) {
      throw new BadInputError('wait needs a timeoutMs of 0 or more and a pollIntervalMs over 0.');
    }
    const deadline = performance.now() + options.timeoutMs;
    for (;;) {
      options.signal?.throwIfAborted();
      const report = await this.status(runId);
      if (isTerminal(report.status)) return report;
      const left = deadline - performance.now();
      if (left <= 0) {
        throw new WaitTimeoutError(
          `run ${report.runId} is still ${report.status} after ${options.timeoutMs} ms.`,
          report,
        );
      }
      await sleep(Math.min(pollMs, left), undefined, { signal: options.signal });
    }
  }

  /**
   * Report a detached runner's result (`report_runner_result`): the first report
   * of an attempt is recorded, and wakes the run when it still waits for it.
   */
  async reportRunnerResult(
    runId: string,
    runnerAttempt: number,
    result?: JsonValue,
  ): Promise<RunnerReport> {
    if (!Number.isInteger(runnerAttempt) || runnerAttempt < 1) {
      throw new BadInputError(`a runner attempt is a whole number from 1, got ${runnerAttempt}.`);
    }
    return this.callFunction<RunnerReport>(
      'report_runner_result',
      ['uuid', 'integer', 'jsonb'],
      [checkedRunId(runId), runnerAttempt, result],
    );
  }

  // -- The release a worker serves (extension point) ---------------------------
  /**
   * The release id (and queue) a worker started with `DEEPLINE_ABSURD_QUEUE_SUFFIX` /
   * `DEEPLINE_RUNTIME_DEPLOY_VERSION` so set serves (`worker_release_id`, by the
   * worker's own lane rules): submit with it instead of deriving it. Null or blank:
   * unset. What a worker would refuse to boot with is a `BadInputError`.
   */
  async workerReleaseId(
    queueSuffix?: string | null,
    deployVersion?: string | null,
  ): Promise<WorkerRelease> {
    return this.callFunction<WorkerRelease>(
      'worker_release_id',
      ['text', 'text'],
      [queueSuffix, deployVersion],
    );
  }
}
