-- Reads and locks on one engine queue's tables. Each starts with a `-- name:
-- <name>` line; `{tasks}`, `{runs}` and `{checkpoints}` are the queue's engine
-- tables and `{schema}` the run-state store, quoted when the text is filled in
-- (worker/db/sql.py). Values are always bound parameters.

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
-- claim (negative: due already), on the database's clock; null when none is.
select extract(epoch from min(available_at) - absurd.current_time())::float8
  from {runs}
 where state in ('pending', 'sleeping');

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
