-- begin_attempt as a function of the store, so that the own loop's claim
-- (lane_worker.claim_with_lanes, in the engine's schema of lane-worker) can
-- record a claim and take the run over in the round trip that claims it. The
-- worker's begin_attempt query calls it too: one definition. Parameters, in
-- order: run, engine run, engine attempt, worker id, release, disposition,
-- adopted release and queue (adopt only), step-key mapping, engine task, queue.
-- PL/pgSQL, not SQL: before PostgreSQL 18 a SQL function plans its statement on
-- every call (0.4 of its 0.5 ms in the bench); PL/pgSQL keeps the plan.
create or replace function {schema}.begin_attempt(
  p_run uuid, p_engine_run uuid, p_attempt integer, p_worker text, p_release text,
  p_disposition text, p_adopted_release text, p_adopted_queue text, p_step_keys smallint,
  p_task uuid, p_queue text)
  returns table (attempt_id bigint, checkpoint jsonb, step_keys smallint, current_wait jsonb,
                 engine_checkpoints jsonb, db_now_ms bigint)
  language plpgsql
as $$
#variable_conflict use_column
begin
return query
with prev as (
  -- The statement's snapshot: only a park or a settle changes the wait, and
  -- neither can commit for a run whose engine run this claim now holds.
  -- No attempt ever took a fresh run over, so none wrote a checkpoint of it.
  select r.current_wait, r.current_attempt_id is null as fresh
    from {schema}.runs r where r.run_id = $1
), attempt as (
  insert into {schema}.attempts (run_id, engine_run_id, attempt, worker_id, release_id, disposition)
  values ($1, $2, $3, $4, $5, $6)
  returning attempt_id
), taken as (
  update {schema}.runs r
     set status = 'running',
         current_attempt_id = (select attempt_id from attempt),
         current_wait = null,
         attempts = greatest(r.attempts, $3),
         adopted_release_id = case when $6 = 'adopt' then $7 else r.adopted_release_id end,
         adopted_queue = case when $6 = 'adopt' then $8 else r.adopted_queue end,
         step_keys = case when r.current_attempt_id is null then $9::smallint else r.step_keys end,
         -- Taken over: whatever deferral streak it had is over.
         defer_count = 0, first_deferred_at = null, defer_alerted_at = null,
         updated_at = now()
   where r.run_id = $1
     and $6 in ('own', 'adopt')
     and r.status not in ('completed', 'failed', 'cancelled')
     -- `lanes move` gave the run a new engine task: a claim of the old one is stale.
     and r.task_id = $10
  returning r.checkpoint, r.step_keys
), superseded as (
  -- Taken over: every older claim of the run that recorded no end (its worker
  -- was killed, or lost its lease) has lost it, in this same statement.
  update {schema}.attempts o
     set outcome = 'lease_lost', finished_at = now(),
         error = coalesce(o.error, jsonb_build_object(
           'reason', 'a newer attempt took the run over'))
    from taken t
   where o.run_id = $1 and o.outcome is null
), started as (
  -- A run whose ledger goes to a runtime API records that it started, once:
  -- when an attempt first takes it over (the relay delivers it, migration 0009).
  insert into {schema}.ledger (run_id, type, fact)
  select $1, 'run.started',
         jsonb_build_object('type', 'run.started', 'runId', $1::text,
                            'occurredAt', (extract(epoch from now()) * 1000)::bigint,
                            'source', 'worker', 'releaseId', $5::text, 'attempt', $3::integer)
    from taken
   where exists (select 1 from {schema}.run_runtime_api x where x.run_id = $1)
  on conflict (run_id) where type = 'run.started' do nothing
)
select a.attempt_id, t.checkpoint, t.step_keys,
       case when t.checkpoint is not null then (select current_wait from prev) end as current_wait,
       case when t.checkpoint is null then null
            when (select fresh from prev) then '{}'::jsonb  -- the engine's read skipped
            else (select coalesce(jsonb_object_agg(c.checkpoint_name, c.state), '{}'::jsonb)
                    from absurd.get_task_checkpoint_states($11, $10, $2) c)
       end as engine_checkpoints,
       (extract(epoch from absurd.current_time()) * 1000)::bigint as db_now_ms
  from attempt a left join taken t on true;
end;
$$;
