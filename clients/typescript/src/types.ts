// What each SQL API function returns, field for field (store migrations 0008,
// 0009, 0010, 0025: the jsonb_build_object calls of submit_run, submit_runs,
// signal_run, cancel_run, run_status and report_runner_result). Timestamps are
// the strings Postgres writes into JSON (`2026-12-07T15:13:16.123456+00:00`).

/** Any JSON value. */
export type JsonValue =
  | string
  | number
  | boolean
  | null
  | JsonValue[]
  | { [key: string]: JsonValue };

/** A JSON object (a run's input must be one). */
export type JsonObject = { [key: string]: JsonValue };

/** A run's status in the store (`runs.status`). */
export type RunStatus =
  | 'queued'
  | 'running'
  | 'waiting'
  | 'retrying'
  | 'completed'
  | 'failed'
  | 'cancelled';

/** The statuses a run ends in: `wait` returns on these. */
export const TERMINAL_STATUSES: readonly RunStatus[] = ['completed', 'failed', 'cancelled'];

/** Whether a run in `status` has ended (completed, failed or cancelled). */
export function isTerminal(status: RunStatus): boolean {
  return TERMINAL_STATUSES.includes(status);
}

/**
 * Where a run's ledger facts are delivered (`submit_run`'s `p_runtime_api`).
 * Tokens are stored only for the delivery relay and never shown by `status`.
 */
export interface RuntimeApi {
  /** An http:// or https:// URL (no user, password, query or fragment). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <executorToken>`. */
  executorToken: string;
  integrationMode?: string | null | undefined;
  /** Sent as `x-vercel-protection-bypass`. */
  vercelProtectionBypassToken?: string | null | undefined;
  /** Sent as `x-runtime-test-fault`. */
  runtimeTestFaultHeader?: string | null | undefined;
}

/** One run to submit (`submit_run`'s arguments; an item of `submit_runs`). */
export interface SubmitRequest {
  play: string;
  /** A JSON object; omitted or null is `{}`. */
  input?: JsonObject | null | undefined;
  /** The release whose lane runs it; omitted: the client's `releaseId`. */
  releaseId?: string | undefined;
  /** A repeat of the key answers the run it names (`created: false`). */
  idempotencyKey?: string | null | undefined;
  runtimeApi?: RuntimeApi | null | undefined;
  /** The engine's attempts, 1..1000; omitted or null: 5. */
  maxAttempts?: number | null | undefined;
}

/** `submit_run`'s result (and each of `submit_runs`'). */
export interface SubmittedRun {
  runId: string;
  /** The lane's queue, e.g. `runs_rel_a`. */
  queue: string;
  /** The release id as given, trimmed; for a repeat of a key, the release of the run it names. */
  releaseId: string;
  /** False when an idempotency key answered a run that already existed. */
  created: boolean;
  /**
   * False when no registered worker serves the run's lane (no claiming lane row, no live
   * worker, not the registry's current release): the run waits until one does.
   */
  served: boolean;
  /**
   * False (store migration 0038) when the lane is served but none of its live workers
   * registers the play: the run is kept, and a worker of the lane puts it back (no attempt
   * spent) until a worker whose app registers it starts; if none of the lane's workers ever
   * registered it, it fails as an unknown play after LANE_WORKER_UNKNOWN_PLAY_GRACE (10
   * minutes by default; the store's `warning` says so, store 0046).
   * Absent otherwise.
   */
  playServed?: boolean;
  /**
   * When `served` is false: one sentence naming the lane and what would serve it; when
   * `playServed` is false: one naming the plays the lane's live workers do register.
   */
  warning?: string;
}

/** `worker_release_id`'s result: the release id a worker so started serves, and its queue. */
export interface WorkerRelease {
  /** As deployed: `dev-<suffix>`, the trimmed deploy version, or `dev`. */
  releaseId: string;
  queue: string;
}

/** `signal_run`'s result. */
export interface SignalResult {
  runId: string;
  eventKey: string;
  /** The event reached a live run (first delivery of its key). */
  delivered: boolean;
  /** The key was delivered before: the first delivery wins, this one changed nothing. */
  duplicate: boolean;
  /** The status of the run that had ended when the signal came, else null. */
  runEnded: 'completed' | 'failed' | 'cancelled' | null;
  /** The run that got it (a retried run passes it to its retry); null for a completed run. */
  deliveredTo: string | null;
  /** A failed or cancelled run keeps the event for a retry of it. */
  keptForRetry: boolean;
}

/** `cancel_run`'s result. */
export interface CancelResult {
  runId: string;
  /** False when the run had already ended (then `status` is how it ended). */
  cancelled: boolean;
  status: RunStatus;
}

/** What one worker decided for a claimed run (`attempts.disposition`). */
export type Disposition = 'own' | 'adopt' | 'defer' | 'refuse';

/** How an attempt ended (`attempts.outcome`); null while it runs. */
export type Outcome =
  | 'completed'
  | 'failed'
  | 'retrying'
  | 'parked'
  | 'deferred'
  | 'handed_back'
  | 'refused'
  | 'lease_lost'
  | 'cancelled';

export interface AttemptReport {
  attempt: number;
  workerId: string;
  releaseId: string;
  disposition: Disposition;
  outcome: Outcome | null;
}

/** A step the run committed, and which attempt (release, worker) committed it. */
export interface StepReport {
  name: string;
  releaseId: string | null;
  attempt: number | null;
  workerId: string | null;
  committedAt: string;
}

/** A ledger fact's delivery to the run's runtime API (absent for runs without one). */
export interface FactDelivery {
  state: 'pending' | 'delivered' | 'failed';
  attempts: number;
  deliveredAt: string | null;
  nextAttemptAt: string | null;
  error: JsonValue;
}

export interface FactReport {
  /** `run.started`, `run.completed`, `run.failed`, `run.cancelled` ... */
  type: string;
  createdAt: string;
  delivery?: FactDelivery;
}

/** A failed run's error: at least its name and message. */
export interface RunError {
  name?: string;
  message?: string;
  [key: string]: JsonValue | undefined;
}

/** `run_status`'s result: what `lane-worker status --json` prints. */
export interface RunReport {
  runId: string;
  play: string;
  status: RunStatus;
  /** The release the run was submitted for, as given. */
  releaseId: string;
  /** The release whose worker adopted the run after a deploy, else null. */
  adoptedReleaseId: string | null;
  queue: string;
  /** The engine attempts the run spent, as maxAttempts counts them (store migration 0036;
   * absent before it). A park and its resume are not attempts. */
  attemptCount?: number;
  maxAttempts?: number;
  /** Each time a worker took the run: an attempt that began or resumed, or a put-back
   * (store migration 0036; absent before it). */
  claims?: AttemptReport[];
  /** The claims under their old name (older builds read it): not a count of attempts. */
  attempts: AttemptReport[];
  /** What the play returned (a completed run), else null. */
  output: JsonValue;
  error: RunError | null;
  /** The run this one retries (`runs retry`), else null. */
  retryOf: string | null;
  steps: StepReport[];
  facts: FactReport[];
}

/** `report_runner_result`'s result. */
export interface RunnerReport {
  runId: string;
  runnerAttempt: number;
  /** The first report of the attempt is recorded; a repeat is not. */
  recorded: boolean;
  duplicate: boolean;
  /** The run waited for this attempt and was woken. */
  woke: boolean;
  /** Why it did not wake the run (timed out, replaced, run ended, reported already), else null. */
  reason: string | null;
}
