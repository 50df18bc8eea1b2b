-- The operator's page (issue 31): its run list and its audited bulk actions.
-- Additive: builds before this one ignore the new index and table.
--
-- The run list filters by status and pages newest first (created_at desc,
-- run_id desc, keyset): a rare status (a few failed runs among a million
-- completed) is read from this index instead of walking every newer run.
create index if not exists runs_status_created_idx
  on {schema}.runs (status, created_at, run_id);
-- And by play: the runs of one play among a million of others.
create index if not exists runs_play_created_idx
  on {schema}.runs (play, created_at, run_id);
-- And by error text: only runs with an error are searched (few, next to the
-- completed ones), newest first, through this partial index.
create index if not exists runs_error_created_idx
  on {schema}.runs (created_at, run_id) where error is not null;
-- A lane's filter matches its own runs (runs_queue_idx, 0022) and those it
-- adopted: few, so a partial index, beside which the two combine (BitmapOr).
create index if not exists runs_adopted_queue_idx
  on {schema}.runs (adopted_queue) where adopted_queue is not null;

-- What an operator did from the page: who (the name given at sign-in and the
-- client's address), when, which action on which filter, how many runs they
-- saw and how many the remedies acted on, left unchanged or refused. Written
-- when the action starts and again when it ends: a row with no finished_at is
-- an action in progress, or one whose worker stopped half-way.
create table if not exists {schema}.page_actions (
  action_id bigint generated always as identity primary key,
  at timestamptz not null default now(),
  who text not null check (char_length(who) between 1 and 200),
  remote text,
  action text not null check (action in ('retry', 'cancel', 'move')),
  filter jsonb not null,
  target text,
  count_seen integer not null,
  matched integer,
  acted integer not null default 0,
  unchanged integer not null default 0,
  refused integer not null default 0,
  -- The first refusals, each {runId, reason}.
  refusals jsonb not null default '[]',
  finished_at timestamptz,
  worker_id text
);
