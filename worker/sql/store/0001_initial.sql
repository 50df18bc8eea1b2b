-- Run-state store, first version. `{schema}` is replaced by the quoted
-- DEEPLINE_RUNTIME_SCHEDULER_SCHEMA before this runs; everything else is literal.
-- Migrations are additive: an older release keeps running against a newer store.

create table {schema}.runs (
  run_id uuid primary key,
  play text not null,
  input jsonb not null,
  -- The launch row as submitted, including the stamped `absurdReleaseId`.
  launch jsonb not null,
  release_id text not null,
  queue text not null,
  task_id uuid,
  status text not null default 'queued'
    check (status in ('queued', 'running', 'waiting', 'retrying', 'completed', 'failed', 'cancelled')),
  -- The durable wait the run is parked in: {"kind": "sleep" | "integration_event", ...}.
  current_wait jsonb,
  checkpoint jsonb not null default '{}'::jsonb,
  adopted_release_id text,
  output jsonb,
  error jsonb,
  idempotency_key text unique,
  attempts integer not null default 0,
  max_attempts integer not null,
  -- The attempt row allowed to write this run: a late write from an older
  -- claim (lease lost, run reclaimed elsewhere) matches nothing.
  current_attempt_id bigint,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  finished_at timestamptz
);

create index runs_queue_open_idx on {schema}.runs (queue, status)
  where status not in ('completed', 'failed', 'cancelled');
create unique index runs_task_idx on {schema}.runs (task_id);

-- One row per claim of a run, whatever the claim decided.
create table {schema}.attempts (
  attempt_id bigint generated always as identity primary key,
  run_id uuid not null references {schema}.runs (run_id) on delete cascade,
  engine_run_id uuid not null,
  -- The engine's attempt number: defers and hand-backs repeat it.
  attempt integer not null,
  worker_id text not null,
  release_id text not null,
  disposition text not null check (disposition in ('own', 'adopt', 'defer', 'refuse')),
  outcome text check (outcome in (
    'completed', 'failed', 'retrying', 'parked', 'deferred', 'handed_back',
    'refused', 'lease_lost', 'cancelled')),
  error jsonb,
  claimed_at timestamptz not null default now(),
  finished_at timestamptz
);

create index attempts_run_idx on {schema}.attempts (run_id, attempt_id);

-- Integration-event payloads. The authority: the engine event only wakes.
create table {schema}.signals (
  run_id uuid not null references {schema}.runs (run_id) on delete cascade,
  event_key text not null,
  payload jsonb,
  received_at timestamptz not null default now(),
  consumed_at timestamptz,
  consumed_by_attempt bigint,
  primary key (run_id, event_key)
);

-- Outbox of run.* facts for the app.
create table {schema}.ledger (
  fact_id bigint generated always as identity primary key,
  run_id uuid not null references {schema}.runs (run_id) on delete cascade,
  type text not null,
  fact jsonb not null,
  created_at timestamptz not null default now(),
  published_at timestamptz
);

-- Each run has at most one terminal fact, whoever writes it.
create unique index ledger_one_terminal_fact on {schema}.ledger (run_id)
  where type in ('run.completed', 'run.failed', 'run.cancelled');
create index ledger_unpublished_idx on {schema}.ledger (fact_id) where published_at is null;

-- Release lanes, keyed by queue. Changed only by registration (never un-retires),
-- `lanes retire` and `lanes activate`; never inferred from timers or machine counts.
create table {schema}.releases (
  queue text primary key,
  status text not null check (status in ('claiming', 'retired')),
  -- Every spelling seen for this lane (raw launch slug, sanitised worker id).
  release_ids text[] not null default '{}',
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  retired_at timestamptz
);

-- Worker heartbeats, for display.
create table {schema}.workers (
  worker_id text primary key,
  release_id text not null,
  queue text not null,
  hostname text not null,
  pid integer not null,
  concurrency integer not null,
  started_at timestamptz not null default now(),
  heartbeat_at timestamptz not null default now(),
  stopped_at timestamptz
);
