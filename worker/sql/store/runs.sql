-- Store queries on runs: launch rows, their signals and facts, the runs a lane holds,
-- and the terminal settle (worker/db/store/runs.py).
-- Each starts with a `-- name: <name>` line and is run by one typed method.
-- `{schema}` is the store schema and `{checkpoints}` a queue's engine checkpoint
-- table, quoted when the text is filled in (worker/db/sql.py). Values are always
-- bound parameters.

-- name: insert_run
insert into {schema}.runs (run_id, play, input, launch, release_id, queue, idempotency_key,
                          max_attempts, retry_of)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
on conflict (idempotency_key) do nothing
returning run_id;

-- name: get_run
select * from {schema}.runs where run_id = $1;

-- name: lock_run
select * from {schema}.runs where run_id = $1 for update;

-- name: lock_run_engine_first
-- lock_run with its engine task's rows locked first, as a completion takes them
-- (store 0048, docs/DESIGN.md "Lock order"): for a caller that then calls the engine.
select r.* from {schema}.runs s, lateral {schema}.run_row_engine_first(s.run_id) r
 where s.run_id = $1;

-- name: lock_run_shared
-- A signal or a status-changing read: waits for a `lanes move`, a `runs retry`
-- or a `runs fail` of the run in progress, and sees what it committed.
select * from {schema}.runs where run_id = $1 for share;

-- name: mark_retried
update {schema}.runs set retried_by = $2, updated_at = now() where run_id = $1;

-- name: copy_signals
-- The events run $1 received, for its retry $2: its plays wait for them again.
-- $3: event keys left out (payloads the operator chose to drop).
insert into {schema}.signals (run_id, event_key, payload, received_at)
select $2, s.event_key, s.payload, s.received_at
  from {schema}.signals s
 where s.run_id = $1 and s.event_key <> all ($3::text[])
on conflict (run_id, event_key) do nothing;

-- name: long_signal_payloads
-- Run $1's signal payloads that may be unreadable: a text under 309 bytes is
-- within every limit of value_limits() (checked_value's cheap case), so only
-- longer ones are read back for the pool's decoder to judge.
select event_key, payload
  from {schema}.signals
 where run_id = $1 and octet_length(payload::text) >= 309
 order by received_at, event_key;

-- name: copy_runtime_api
-- Run $1's runtime API context, for its retry $2 (migration 0008): the retry's
-- ledger facts go where the run's went.
insert into {schema}.run_runtime_api (run_id, api)
select $2, a.api from {schema}.run_runtime_api a where a.run_id = $1
on conflict (run_id) do nothing;

-- name: list_runs
-- Newest first; each filter applies when given (a lane matches its own runs
-- and the runs it adopted; status `open` matches every run not finished).
select run_id, play, status, {schema}.release_as_deployed(release_id) as release_id, queue,
       {schema}.release_as_deployed(adopted_release_id) as adopted_release_id, attempts,
       created_at, retry_of
  from {schema}.runs
 where ($1::text is null or status = $1
        or ($1 = 'open' and status not in ('completed', 'failed', 'cancelled')))
   and ($2::text is null or queue = $2 or adopted_queue = $2)
   and ($3::text is null or play = $3)
 order by created_at desc, run_id
 limit $4;

-- name: lane_open_runs
-- Open runs whose effective lane is $1 (what `lanes move` considers), oldest first.
select run_id from {schema}.runs
 where coalesce(adopted_queue, queue) = $1
   and status not in ('completed', 'failed', 'cancelled')
 order by created_at, run_id;

-- name: move_run
update {schema}.runs
   set queue = $2, release_id = $3,
       launch = launch || jsonb_build_object('absurdReleaseId', $3::text),
       updated_at = now()
 where run_id = $1;

-- name: step_provenance
-- Which attempt (and so which release) committed each of a task's checkpoints:
-- the own/adopt attempt on the checkpoint's engine run that began last before
-- the write (a run handed back mid-step keeps its engine run).
select c.checkpoint_name, c.updated_at, a.attempt,
       {schema}.release_as_deployed(a.release_id) as release_id, a.worker_id
  from {checkpoints} c
  left join lateral (
    select a.attempt, a.release_id, a.worker_id
      from {schema}.attempts a
     where a.run_id = $2 and a.engine_run_id = c.owner_run_id
       and a.disposition in ('own', 'adopt') and a.claimed_at <= c.updated_at
     order by a.claimed_at desc, a.attempt_id desc
     limit 1) a on true
 where c.task_id = $1
 order by c.updated_at, c.checkpoint_name;

-- name: run_attempts
select a.attempt, a.worker_id, {schema}.release_as_deployed(a.release_id) as release_id,
       a.disposition, a.outcome, a.error, a.claimed_at, a.finished_at
  from {schema}.attempts a
 where a.run_id = $1
 order by a.attempt_id;

-- name: settle_run
-- Terminal state for a run and its one terminal fact, fenced by attempt $2
-- unless that is null: settle_run (migration 0008, shared with cancel_run),
-- the fact built by the store from the status and source $6 (0032). Null when
-- nothing was settled.
select {schema}.settle_run_by($1, $2, $3, $4, $5, $6, $7);

-- name: spawn_run_task
-- The engine task of run $1 (written in this transaction) on queue $2, and the
-- NOTIFY that wakes the lane: the store's spawn_run_task (migration 0008).
select {schema}.spawn_run_task($1, $2, $3);

-- name: run_page
-- What the run page shows beside run_status: its input, the wait it is parked
-- in, its bucket while it is open (migration 0014), its clock, and the
-- database's now.
select r.run_id, r.input, r.current_wait, r.attempts, r.max_attempts, r.defer_count,
       r.created_at, r.updated_at, r.finished_at, now() as as_of,
       case when r.status not in ('completed', 'failed', 'cancelled')
            then {schema}.open_run_bucket(r.status, r.current_attempt_id, r.current_wait)
       end as bucket,
       false as payloads_hidden
  from {schema}.runs r
 where r.run_id = $1;

-- name: run_page_bookkeeping
-- run_page for a role that may not read runs' inputs nor waits (the viewer: issue
-- 33): no input, the wait's short fields and the bucket with the owner's rights
-- (store 0049).
select r.run_id, null::jsonb as input, p.current_wait, r.attempts, r.max_attempts,
       r.defer_count, r.created_at, r.updated_at, r.finished_at, now() as as_of, p.bucket,
       true as payloads_hidden
  from {schema}.runs r
  cross join {schema}.run_page_bookkeeping_v1($1) p
 where r.run_id = $1;

-- name: run_facts
select type, fact, created_at from {schema}.ledger where run_id = $1 order by fact_id;

-- name: queue_has_open_runs
select exists (select 1 from {schema}.runs
                where queue = $1 and status not in ('completed', 'failed', 'cancelled'));
