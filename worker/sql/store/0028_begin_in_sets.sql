-- The own loop's claim begins its certain own attempts as one set (issue 30):
-- lane_worker.claim_with_lanes_v2 (engine contract claim_v2) calls this once
-- per claim instead of begin_attempt (0017) once per run, and reads the store
-- facts every claimed run is decided from in the same static statement. Both
-- are PL/pgSQL with static SQL, so their plans are kept across claims.

-- The store facts of claimed engine tasks p_tasks (the lane_state query of
-- attempts.sql, per task) and whether each run's release names the claimer's
-- lane p_own_queue (the lane guard: two spellings of one release id name one
-- queue; p_begin_release is the claimer's own release id). A task without a
-- store row (a sandbox's cleanup) has null facts and is on no lane.
create or replace function {schema}.claimed_facts(
  p_tasks uuid[], p_own_queue text, p_begin_release text)
  returns table (task_id uuid, run_id uuid, release_id text, adopted_release_id text,
                 adopted_queue text, status text, current_wait jsonb, play text, input jsonb,
                 lane_claiming boolean, adopter_claiming boolean, on_own_lane boolean)
  language plpgsql
  stable
as $$
#variable_conflict use_column
begin
  return query
  select t.task_id, r.run_id, r.release_id, r.adopted_release_id, r.adopted_queue, r.status,
         r.current_wait, r.play, r.input,
         coalesce(l.status = 'claiming', false),
         coalesce(al.status = 'claiming', false),
         case when coalesce(r.release_id, '') = '' then false
              when r.release_id = p_begin_release then true
              else {schema}.queue_for_release(r.release_id) = p_own_queue end
    from unnest(p_tasks) as t(task_id)
    left join {schema}.runs r on r.task_id = t.task_id
    left join {schema}.releases l on l.queue = r.queue
    left join {schema}.releases al on al.queue = r.adopted_queue;
end;
$$;

-- begin_attempt (0017) with disposition 'own' for a set of claimed runs: run
-- p_runs[i] claimed as engine run p_engine_runs[i] (engine attempt
-- p_attempts[i], engine task p_tasks[i]) of queue p_queue, by worker p_worker
-- of release p_release with step-key mapping p_step_keys. A run whose store
-- row another session holds locked is skipped (no row for it): the worker
-- begins it after the claim, where the wait holds up that run alone. Returns
-- begin_attempt's row for each run begun, keyed by its engine run.
create or replace function {schema}.begin_attempts(
  p_runs uuid[], p_engine_runs uuid[], p_attempts integer[], p_tasks uuid[],
  p_worker text, p_release text, p_step_keys smallint, p_queue text)
  returns table (engine_run_id uuid, attempt_id bigint, checkpoint jsonb, step_keys smallint,
                 current_wait jsonb, engine_checkpoints jsonb, db_now_ms bigint)
  language plpgsql
as $$
#variable_conflict use_column
declare
  v_locked uuid[];
begin
  select array_agg(r.run_id) into v_locked
    from (select r.run_id from {schema}.runs r where r.run_id = any(p_runs)
           order by r.run_id for update skip locked) r;
  if v_locked is null then
    return;
  end if;
  return query
  with w as (
    select * from unnest(p_runs, p_engine_runs, p_attempts, p_tasks)
                  as w(run_id, engine_run_id, attempt, task_id)
     where w.run_id = any(v_locked)
  ), prev as (
    -- The statement's snapshot, as in begin_attempt.
    select r.run_id, r.current_wait, r.current_attempt_id is null as fresh
      from {schema}.runs r where r.run_id = any(v_locked)
  ), attempt as (
    insert into {schema}.attempts
           (run_id, engine_run_id, attempt, worker_id, release_id, disposition)
    select w.run_id, w.engine_run_id, w.attempt, p_worker, p_release, 'own' from w
    returning attempt_id, run_id, engine_run_id
  ), taken as (
    update {schema}.runs r
       set status = 'running',
           current_attempt_id = a.attempt_id,
           current_wait = null,
           attempts = greatest(r.attempts, w.attempt),
           step_keys = case when r.current_attempt_id is null then p_step_keys
                            else r.step_keys end,
           defer_count = 0, first_deferred_at = null, defer_alerted_at = null,
           updated_at = now()
      from w join attempt a on a.engine_run_id = w.engine_run_id
     where r.run_id = w.run_id
       and r.status not in ('completed', 'failed', 'cancelled')
       -- `lanes move` gave the run a new engine task: a claim of the old one is stale.
       and r.task_id = w.task_id
    returning r.run_id, a.engine_run_id, r.checkpoint, r.step_keys
  ), superseded as (
    update {schema}.attempts o
       set outcome = 'lease_lost', finished_at = now(),
           error = coalesce(o.error, jsonb_build_object(
             'reason', 'a newer attempt took the run over'))
      from taken t
     where o.run_id = t.run_id and o.outcome is null
  ), started as (
    insert into {schema}.ledger (run_id, type, fact)
    select t.run_id, 'run.started',
           jsonb_build_object('type', 'run.started', 'runId', t.run_id::text,
                              'occurredAt', (extract(epoch from now()) * 1000)::bigint,
                              'source', 'worker', 'releaseId', p_release::text,
                              'attempt', w.attempt::integer)
      from taken t join w on w.engine_run_id = t.engine_run_id
     where exists (select 1 from {schema}.run_runtime_api x where x.run_id = t.run_id)
    on conflict (run_id) where type = 'run.started' do nothing
  )
  select a.engine_run_id, a.attempt_id, t.checkpoint, t.step_keys,
         case when t.checkpoint is not null then p.current_wait end,
         case when t.checkpoint is null then null
              when p.fresh then '{}'::jsonb  -- no attempt took it over: no checkpoint
              else (select coalesce(jsonb_object_agg(c.checkpoint_name, c.state), '{}'::jsonb)
                      from absurd.get_task_checkpoint_states(p_queue, w.task_id,
                                                             w.engine_run_id) c)
         end,
         (extract(epoch from absurd.current_time()) * 1000)::bigint
    from attempt a
    join w on w.engine_run_id = a.engine_run_id
    left join taken t on t.engine_run_id = a.engine_run_id
    left join prev p on p.run_id = a.run_id;
end;
$$;
