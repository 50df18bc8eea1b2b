-- The engine calls lane-worker makes: Absurd's stored functions, this project's
-- engine-side contracts (claim_v1.sql, notify_v1.sql: each call names the
-- contract version it was written for), and reads and locks on one engine queue's
-- tables. Each starts with a `-- name: <name>` line and is run by one function
-- of worker/db/engine.py or worker/db/engine_schema.py. `{tasks}`, `{runs}` and
-- `{checkpoints}` are a queue's engine tables and `{schema}` the run-state store,
-- quoted when the text is filled in (worker/db/sql.py). Values are always bound
-- parameters.

-- name: install_lock
-- Serialises every lane-worker install step ($1: its advisory lock key).
select pg_advisory_xact_lock($1);

-- name: schema_version_present
select to_regprocedure('absurd.get_schema_version()') is not null;

-- name: schema_version
select absurd.get_schema_version();

-- name: contracts_table
-- The ledger of engine-side contracts and the lane-worker version that installed
-- each (docs/DESIGN.md "Builds side by side"). Shared by every build from 0.2.0
-- on, so its columns may be added to, never changed.
create schema if not exists lane_worker;
create table if not exists lane_worker.contracts (
  contract text primary key,
  installed_by text not null,
  checksum text not null,
  installed_at timestamptz not null default now());

-- name: contracts_table_present
select to_regclass('lane_worker.contracts') is not null;

-- name: contract_installed
-- Who installed contract $1 ($1: its file's name without .sql), and from what text.
select installed_by, checksum from lane_worker.contracts where contract = $1;

-- name: contracts_present
-- How many of the contracts $1 are installed (by this build's version or another).
select count(*) from lane_worker.contracts where contract = any($1::text[]);

-- name: record_contract
insert into lane_worker.contracts (contract, installed_by, checksum) values ($1, $2, $3)
on conflict (contract) do update
   set installed_by = excluded.installed_by, checksum = excluded.checksum,
       installed_at = now();

-- name: create_queue
-- Only when absurd.queues has no row for $1: an existing queue is left as it is,
-- whatever its storage mode. create_queue($1) asks for an unpartitioned queue and
-- raises on a partitioned one the TypeScript app made (issue 29, F7).
select absurd.create_queue($1)
 where not exists (select 1 from absurd.queues where queue_name = $1);

-- name: queue_created_here
-- Whether this transaction inserted queue $1's row: absurd.create_queue inserts
-- it "on conflict do nothing", so a queue that was there before, or that another
-- session created meanwhile, has another transaction's xmin. Compared with the
-- top-level transaction's id: a row made in a savepoint reads as not ours, and
-- lane-worker's policy is then left off (never set on what it may not own).
select coalesce(x.xmin = pg_current_xact_id_if_assigned()::xid, false)
  from absurd.queues x
 where x.queue_name = $1;

-- name: watch_queue
-- The NOTIFY trigger on the queue's engine runs (notify_v1.sql); true: installed now.
select lane_worker.watch_queue_v1($1);

-- name: set_queue_policy
select absurd.set_queue_policy($1, $2::jsonb);

-- name: queue_exists
select exists (select 1 from absurd.queues where queue_name = $1);

-- name: drop_queue
select absurd.drop_queue($1);

-- name: claim_task
-- The engine's own claim, in claim_lane_v1's row shape (it sweeps nothing it
-- reports). Every task of the queue, another system's too: only for a caller
-- without a store (the daemon's loops claim with claim_next).
select run_id, task_id, attempt, task_name, params, max_attempts, wake_event, event_payload,
       0 as swept
  from absurd.claim_task($1, $2, $3, $4);

-- name: next_due_in
-- The same filter as claim_lane_v1: only runs that loop would be handed.
select lane_worker.next_due_in_v1($1, $2, $3, $4, $5);

-- name: complete_run
select absurd.complete_run($1, $2, $3);

-- name: fail_run
select absurd.fail_run($1, $2, $3, $4);

-- name: schedule_run
select absurd.schedule_run($1, $2, $3);

-- name: schedule_run_in
-- Back to sleep for $3 seconds of the database's clock.
select absurd.schedule_run($1, $2,
                           absurd.current_time() + make_interval(secs => $3::double precision));

-- name: extend_claim
-- Waits at most $4 ms for the run's row lock (claim_v1.sql).
select lane_worker.extend_claim_within_v1($1, $2, $3, $4);

-- name: set_checkpoint_state
-- $4 is the state's JSON text, encoded once by its writer (as a batch sends it).
select absurd.set_task_checkpoint_state($1, $2, $3, $4::text::jsonb, $5, $6);

-- name: await_event
-- An emitted event's payload is never SQL NULL (emit_event stores JSON null when
-- given none); SQL NULL is the engine saying the wait timed out.
select should_suspend, payload, payload is not null as delivered
  from absurd.await_event($1, $2, $3, $4, $5, $6);

-- name: cancel_task
select absurd.cancel_task($1, $2);

-- name: task_state
select state from absurd.get_task_result($1, $2);

-- name: lock_if_held
-- Lock engine run $1 while it still runs under worker $2 (a give-back's fence).
select true from {runs}
 where run_id = $1 and state = 'running' and claimed_by = $2
   for update;

-- name: held_runs
-- The engine runs worker $1 still holds on this queue (left over at shutdown).
select run_id, task_id, attempt from {runs}
 where state = 'running' and claimed_by = $1;

-- name: next_due
-- Seconds until the next run of this queue is claimable by the engine's own
-- claim (claim_v1.sql says how; negative: due already), or null.
select lane_worker.next_due_any_v1($1);

-- name: claim_next
-- A loop's claim and, when it fell short, the next due time, one round trip
-- (claim_v2.sql); with $9, the store's facts too; with $10, begun attempts.
select * from lane_worker.claim_next_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);

-- name: reconcile_batch
-- Up to $2 open store runs of queue $1 whose engine task ended by itself (an
-- expired lease on the last attempt, a cancellation policy) or vanished.
select s.run_id, s.release_id, t.state, t.completed_payload, r.failure_reason
  from {schema}.runs s
  left join {tasks} t on t.task_id = s.task_id
  left join {runs} r on r.run_id = t.last_attempt_run
 where s.queue = $1
   and s.task_id is not null
   and s.status not in ('completed', 'failed', 'cancelled')
   and (t.task_id is null or t.state in ('completed', 'failed', 'cancelled'))
 limit $2;

-- name: queues_unprepared
-- Of queues $1, those that lack their engine queue or the NOTIFY trigger
-- (watch_queue_v1): one read for a whole registry refresh, so attaching many loops
-- costs a statement per queue only where one is missing. The cleanup policy is not
-- asked: an existing queue keeps its creator's (issue 29).
select q.queue
  from unnest($1::text[]) as q(queue)
 where not exists (select 1 from absurd.queues x where x.queue_name = q.queue)
    or not exists (select 1 from pg_trigger t
                    where t.tgrelid = to_regclass(format('absurd.%I', 'r_' || q.queue))
                      and t.tgname = 'lane_worker_runnable_v1');

-- name: next_due_many
-- The claim loops' safety net: for each queue of $1 claimed in mode $5 (null: the
-- engine's own claim), seconds until its loop's claim hands out a run (as
-- next_due_in_v1 / next_due_any_v1; negative: due already), null when none; a queue
-- that is gone (pruned) is reported absent. The caller keeps $1 to a bounded
-- batch: every queue read locks its run table and indexes until commit.
select q.queue,
       x.queue_name is not null as present,
       case when x.queue_name is null then null
            when q.mode is null then lane_worker.next_due_any_v1(q.queue)
            else lane_worker.next_due_in_v1(q.queue, $2, $3, q.mode, $4) end as due_in_s
  from unnest($1::text[], $5::text[]) as q(queue, mode)
  left join absurd.queues x on x.queue_name = q.queue;
