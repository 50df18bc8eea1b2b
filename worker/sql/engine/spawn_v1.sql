-- Engine-side contract spawn_v1: the engine tasks of many runs of one queue in
-- one statement (issue 30, bulk submit), instead of one absurd.spawn_task call
-- per run, which plans its two dynamic inserts on every call. It writes what
-- spawn_task writes for a task without an idempotency key, headers or a
-- cancellation policy (lane-worker's `play-run` tasks have none): the task
-- pending with its params, retry strategy and max attempts, enqueued now on
-- the engine's clock, and its first run pending, due now.
-- tests/integration/test_spawn_sets.py holds it to spawn_task: the same tasks
-- spawned both ways leave the same rows but for their ids.
-- Names end in _v1 (docs/DESIGN.md "Builds side by side").
create schema if not exists lane_worker;

-- Spawn task p_task_name with params p_params[i] and max attempts
-- p_max_attempts[i] for each i on queue p_queue, every one with retry strategy
-- p_retry_strategy (checked as spawn_task checks it). Returns each one's task
-- and first run, by its position (0-based) in the arrays.
create or replace function lane_worker.spawn_tasks_v1(
  p_queue text, p_task_name text, p_params jsonb[], p_max_attempts integer[],
  p_retry_strategy jsonb)
  returns table (at integer, task_id uuid, run_id uuid)
  language plpgsql
as $$
declare
  v_now timestamptz := absurd.current_time();
begin
  if p_task_name is null or length(trim(p_task_name)) = 0 then
    raise exception 'task_name must be provided';
  end if;
  perform absurd.retry_delay_seconds(p_retry_strategy, 1);
  if exists (select 1 from unnest(p_max_attempts) m where m < 1) then
    raise exception 'max_attempts must be >= 1';
  end if;
  return query execute format($sql$
    with w as materialized (
      select (w.n - 1)::integer as at, absurd.portable_uuidv7() as task_id,
             absurd.portable_uuidv7() as run_id, coalesce(w.params, 'null'::jsonb) as params,
             w.max_attempts
        from unnest($1::jsonb[], $2::integer[]) with ordinality as w(params, max_attempts, n)
    ), tasks as (
      insert into absurd.%1$I (task_id, task_name, params, headers, retry_strategy,
                               max_attempts, cancellation, enqueue_at, first_started_at, state,
                               attempts, last_attempt_run, completed_payload, cancelled_at,
                               idempotency_key)
      select w.task_id, $3, w.params, null, $4, w.max_attempts, null, $5, null, 'pending', 1,
             w.run_id, null, null, null
        from w order by w.at
    ), runs as (
      insert into absurd.%2$I (run_id, task_id, attempt, state, available_at, wake_event,
                               event_payload, result, failure_reason)
      select w.run_id, w.task_id, 1, 'pending', $5, null, null, null, null
        from w order by w.at
    )
    select w.at, w.task_id, w.run_id from w order by w.at
  $sql$, 't_' || p_queue, 'r_' || p_queue)
  using p_params, p_max_attempts, p_task_name, p_retry_strategy, v_now;
end;
$$;
