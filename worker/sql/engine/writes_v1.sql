-- Engine-side contract writes_v1: the hot path's engine writes for a whole
-- group-commit batch at once, set-based, instead of one engine call per run.
-- absurd.set_task_checkpoint_state and absurd.complete_run plan three or four
-- dynamic statements on every call; these plan a constant number per batch
-- and queue, however many runs the batch holds (docs/DESIGN.md "Speed").
-- Every name here ends in _v1 (docs/DESIGN.md "Builds side by side"); within
-- v1 a body may be fixed, never change its meaning, arguments or results.
--
-- Each does what the engine's function does for each of its writes, and says
-- which failed instead of raising: the worker sends a failed write again
-- alone, through the engine's own function, which raises the error its caller
-- acts on. tests/integration/test_write_sets.py holds them to the engine's
-- functions: the same histories written both ways leave the same rows.
-- Positions (`at`) are 0-based, in the order of the arrays.
create schema if not exists lane_worker;

-- absurd.set_task_checkpoint_state for the checkpoints of queue p_queue among
-- the arrays (p_queues[i] names each one's queue): the owner run's attempt must
-- be at least the attempt that wrote the checkpoint last, a cancelled task or
-- a failed run refuses (AB001, AB002), an unknown run or a blank name fails
-- (P0001), and the lease is extended by p_extend_s[i] seconds when that is
-- over 0. Two writes of one checkpoint in one call: the later one stands.
create or replace function lane_worker.checkpoints_set_v1(
  p_queue text, p_queues text[], p_tasks uuid[], p_names text[], p_states jsonb[],
  p_runs uuid[], p_extend_s integer[])
  returns table (at integer, error_code text)
  language plpgsql
as $$
begin
  return query execute format($sql$
    with w as (
      select w.task_id, w.name, w.state, w.run_id, w.extend_s, (w.n - 1)::integer as at
        from unnest($1::text[], $2::uuid[], $3::text[], $4::jsonb[], $5::uuid[], $6::integer[])
             with ordinality as w(queue, task_id, name, state, run_id, extend_s, n)
       where w.queue = $7),
    verdict as (
      select w.*,
             case when w.name is null or length(trim(w.name)) = 0 then 'P0001'
                  when t.task_id is null then 'P0001'
                  when t.state = 'cancelled' then 'AB001'
                  when r.state = 'failed' then 'AB002' end as error_code
        from w left join absurd.%1$I r on r.run_id = w.run_id
               left join absurd.%2$I t on t.task_id = r.task_id),
    extended as (
      update absurd.%1$I r
         set claim_expires_at = $8 + make_interval(secs => v.extend_s)
        from verdict v
       where v.error_code is null and v.extend_s > 0 and r.run_id = v.run_id
         and r.state = 'running' and r.claim_expires_at is not null),
    latest as (
      select distinct on (v.task_id, v.name) v.task_id, v.name, v.state, v.run_id
        from verdict v where v.error_code is null
       order by v.task_id, v.name, v.at desc),
    saved as (
      insert into absurd.%3$I as c
             (task_id, checkpoint_name, state, status, owner_run_id, updated_at)
      select l.task_id, l.name, l.state, 'committed', l.run_id, $8 from latest l
      on conflict (task_id, checkpoint_name) do update
         set state = excluded.state, status = excluded.status,
             owner_run_id = excluded.owner_run_id, updated_at = excluded.updated_at
       where coalesce((select o.attempt from absurd.%1$I o where o.run_id = c.owner_run_id), -1)
             <= (select n.attempt from absurd.%1$I n where n.run_id = excluded.owner_run_id))
    select v.at, v.error_code from verdict v where v.error_code is not null
  $sql$, 'r_' || p_queue, 't_' || p_queue, 'c_' || p_queue)
  using p_queues, p_tasks, p_names, p_states, p_runs, p_extend_s, p_queue,
        absurd.current_time();
end;
$$;

-- absurd.complete_run's check for the runs of queue p_queue among the arrays:
-- each run's row is locked (in run id order, so two batches never wait on each
-- other in a cycle) and judged as complete_run judges it: unknown (P0001),
-- cancelled (AB001), failed (AB002), not running (P0001), or null when it
-- may complete. Nothing is written: the store decides its own fence next, and
-- lane_worker.complete_apply_v1 completes only what both allow.
create or replace function lane_worker.complete_check_v1(
  p_queue text, p_queues text[], p_runs uuid[])
  returns table (at integer, task_id uuid, error_code text)
  language plpgsql
as $$
begin
  execute format(
    'select 1 from absurd.%I where run_id = any($1) order by run_id for update',
    'r_' || p_queue)
  using (select array_agg(w.run_id) from unnest(p_queues, p_runs) as w(queue, run_id)
          where w.queue = p_queue);
  return query execute format($sql$
    select (w.n - 1)::integer, r.task_id,
           case when r.run_id is null then 'P0001'
                when r.state = 'running' then null
                when r.state = 'cancelled' then 'AB001'
                when r.state = 'failed' then 'AB002'
                else 'P0001' end
      from unnest($1::text[], $2::uuid[]) with ordinality as w(queue, run_id, n)
      left join absurd.%I r on r.run_id = w.run_id
     where w.queue = $3
  $sql$, 'r_' || p_queue)
  using p_queues, p_runs, p_queue;
end;
$$;

-- absurd.complete_run's writes for runs p_runs of queue p_queue (their tasks
-- p_tasks, results p_results), each already checked by complete_check_v1 in
-- this transaction: the run and its task completed, the run's waits removed.
create or replace function lane_worker.complete_apply_v1(
  p_queue text, p_runs uuid[], p_tasks uuid[], p_results jsonb[])
  returns void
  language plpgsql
as $$
begin
  if coalesce(cardinality(p_runs), 0) = 0 then
    return;
  end if;
  execute format($sql$
    with w as (
      select * from unnest($1::uuid[], $2::uuid[], $3::jsonb[]) as w(run_id, task_id, result)),
    runs as (
      update absurd.%1$I r
         set state = 'completed', completed_at = $4, result = w.result
        from w where r.run_id = w.run_id),
    tasks as (
      update absurd.%2$I t
         set state = 'completed', completed_payload = w.result, last_attempt_run = w.run_id
        from w where t.task_id = w.task_id)
    delete from absurd.%3$I x using w where x.run_id = w.run_id
  $sql$, 'r_' || p_queue, 't_' || p_queue, 'w_' || p_queue)
  using p_runs, p_tasks, p_results, absurd.current_time();
end;
$$;
