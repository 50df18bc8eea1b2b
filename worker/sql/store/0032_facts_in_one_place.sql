-- A run's terminal fact is built in one place, the store (issue 30): before,
-- workers, the reconciler and the remedies built run.completed / run.failed /
-- run.cancelled in Python and cancel_run built its own in SQL, two builders of
-- one shape the app reads. Now terminal_fact builds it from what the settle
-- writes; a completion sends its output once instead of twice (the output and
-- a fact holding it). run.started is built by the begin functions (0017, 0028).
--
-- Older builds still send their facts: settle_run, complete_attempt and
-- write_completions keep their signatures and write a fact given to them as
-- it is, and build it only when it is null.

-- The terminal fact of run p_run_id settling p_status, in the app's shape
-- (absurdTerminalLedgerEvent): type, runId, occurredAt (epoch ms, the
-- database's clock), source (worker, reconciler, client, operator), then the
-- completed run's result or the failed run's error without its traceback (the
-- store, `status` and the logs keep that; the app's error is name and message),
-- and a cancel's reason when one was given.
create or replace function {schema}.terminal_fact(
  p_status text, p_run_id uuid, p_output jsonb, p_error jsonb, p_source text,
  p_reason text default null)
  returns jsonb
  language plpgsql
  stable
as $$
declare
  v_fact jsonb;
begin
  if p_status not in ('completed', 'failed', 'cancelled') then
    raise exception '% is not a terminal status', coalesce(p_status, 'null')
      using errcode = '22023';
  end if;
  v_fact := jsonb_build_object(
    'type', 'run.' || p_status, 'runId', p_run_id::text,
    'occurredAt', floor(extract(epoch from clock_timestamp()) * 1000)::bigint,
    'source', p_source);
  if p_status = 'completed' then
    v_fact := v_fact || jsonb_build_object('result', p_output);
  elsif p_status = 'failed' then
    v_fact := v_fact || jsonb_build_object('error', case jsonb_typeof(p_error)
                                                      when 'object' then p_error - 'traceback'
                                                      else p_error end);
  end if;
  if p_reason is not null then
    v_fact := v_fact || jsonb_build_object('reason', p_reason);
  end if;
  return v_fact;
end;
$$;

-- settle_run (0008) with the fact built here: what this build's workers,
-- reconciler and remedies call. p_source names who settles.
create or replace function {schema}.settle_run_by(
  p_run_id uuid, p_fence bigint, p_status text, p_output jsonb, p_error jsonb,
  p_source text, p_own_attempt bigint)
  returns uuid
  language sql
as $$
  select {schema}.settle_run(
    p_run_id, p_fence, p_status, p_output, p_error, 'run.' || p_status,
    {schema}.terminal_fact(p_status, p_run_id, p_output, p_error, p_source), p_own_attempt);
$$;

-- complete_attempt (0016), the fact built when the caller sends none.
create or replace function {schema}.complete_attempt(
  p_queue text, p_engine_run uuid, p_output jsonb, p_run_id uuid, p_attempt bigint,
  p_fact jsonb)
  returns void
  language plpgsql
as $$
begin
  perform absurd.complete_run(p_queue, p_engine_run, p_output);
  if {schema}.settle_run(
       p_run_id, p_attempt, 'completed', p_output, null, 'run.completed',
       coalesce(p_fact, {schema}.terminal_fact('completed', p_run_id, p_output, null, 'worker')),
       null) is null then
    raise exception using errcode = 'LW001',
      message = format('run %s was settled by a newer claim', p_run_id);
  end if;
  update {schema}.attempts
     set outcome = 'completed', error = null, finished_at = now()
   where attempt_id = p_attempt and outcome is null;
end;
$$;

-- write_completions (0027), each fact built when the caller sends none (this
-- build sends p_facts null). Otherwise as 0027: the engine's check, the
-- store's fence (LW001), then what both allow is written as sets; a lock held
-- past p_lock_wait_ms makes every write go alone through complete_attempt.
create or replace function {schema}.write_completions(
  p_lock_wait_ms integer, p_queues text[], p_engine_runs uuid[], p_outputs jsonb[],
  p_runs uuid[], p_attempts bigint[], p_facts jsonb[])
  returns table (write_at integer, error_code text)
  language plpgsql
as $$
declare
  v_queue text;
  v_n integer := coalesce(cardinality(p_queues), 0);
  v_tasks uuid[];
  v_codes text[];
  v_ok integer[];
  v_at integer;
  v_task uuid;
  v_code text;
begin
  if v_n = 0 then
    return;
  end if;
  perform set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
  v_tasks := array_fill(null::uuid, array[v_n]);
  v_codes := array_fill(null::text, array[v_n]);
  begin
    for v_queue in select distinct q from unnest(p_queues) as q loop
      for v_at, v_task, v_code in
        select c.at, c.task_id, c.error_code
          from lane_worker.complete_check_v1(v_queue, p_queues, p_engine_runs) c
      loop
        v_tasks[v_at + 1] := v_task;
        v_codes[v_at + 1] := v_code;
      end loop;
    end loop;
    -- The store's fence, its rows locked in run id order.
    perform 1 from {schema}.runs where run_id = any(p_runs) order by run_id for update;
    select coalesce(array_agg(w.n::integer), '{}') into v_ok
      from unnest(p_runs, p_attempts, v_codes) with ordinality as w(run_id, attempt_id, code, n)
      join {schema}.runs s on s.run_id = w.run_id
     where w.code is null and s.current_attempt_id = w.attempt_id
       and s.status not in ('completed', 'failed', 'cancelled');
    for v_at in 1 .. v_n loop
      if v_codes[v_at] is null and not v_at = any(v_ok) then
        v_codes[v_at] := 'LW001';
      end if;
    end loop;
    for v_queue in select distinct p_queues[i] from unnest(v_ok) as i loop
      perform lane_worker.complete_apply_v1(
        v_queue,
        array(select p_engine_runs[i] from unnest(v_ok) as i where p_queues[i] = v_queue),
        array(select v_tasks[i] from unnest(v_ok) as i where p_queues[i] = v_queue),
        array(select p_outputs[i] from unnest(v_ok) as i where p_queues[i] = v_queue));
    end loop;
    with ok as (
      select p_runs[i] as run_id, p_attempts[i] as attempt_id, p_outputs[i] as output,
             coalesce(p_facts[i], {schema}.terminal_fact(
               'completed', p_runs[i], p_outputs[i], null, 'worker')) as fact
        from unnest(v_ok) as i),
    settled as (
      update {schema}.runs s
         set status = 'completed', output = ok.output, error = null, current_wait = null,
             finished_at = now(), updated_at = now()
        from ok where s.run_id = ok.run_id),
    facts as (
      insert into {schema}.ledger (run_id, type, fact)
      select ok.run_id, 'run.completed', ok.fact from ok
      on conflict (run_id) where type in ('run.completed', 'run.failed', 'run.cancelled')
      do nothing),
    others_lost as (
      update {schema}.attempts a
         set outcome = 'lease_lost', finished_at = now(),
             error = coalesce(a.error, jsonb_build_object(
               'reason', 'the run ended without this attempt'))
        from ok
       where a.run_id = ok.run_id and a.outcome is null and a.attempt_id <> ok.attempt_id)
    update {schema}.attempts a
       set outcome = 'completed', error = null, finished_at = now()
      from ok where a.attempt_id = ok.attempt_id and a.outcome is null;
  exception when lock_not_available then
    v_codes := array_fill(null::text, array[v_n]);
    for v_at in 1 .. v_n loop
      begin
        perform {schema}.complete_attempt(
          p_queues[v_at], p_engine_runs[v_at], p_outputs[v_at], p_runs[v_at],
          p_attempts[v_at], p_facts[v_at]);
      exception when others then
        get stacked diagnostics v_code = returned_sqlstate;
        v_codes[v_at] := v_code;
      end;
    end loop;
  end;
  return query
    select (w.n - 1)::integer, w.code
      from unnest(v_codes) with ordinality as w(code, n) where w.code is not null;
end;
$$;

-- cancel_run (0008), its run.cancelled fact (source client, with the reason
-- when given) built by terminal_fact.
create or replace function {schema}.cancel_run(p_run_id uuid, p_reason text default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_row {schema}.runs;
begin
  if char_length(p_reason) > 1000 then
    raise exception 'a cancel reason has at most 1000 characters.' using errcode = '22023';
  end if;
  -- Locked: a `lanes move` in progress gives the run a new engine task.
  v_row := {schema}.run_row(p_run_id, 'update');
  if v_row.status in ('completed', 'failed', 'cancelled') then
    return jsonb_build_object('runId', v_row.run_id, 'cancelled', false, 'status', v_row.status);
  end if;
  if v_row.task_id is not null then
    perform absurd.cancel_task(v_row.queue, v_row.task_id);
  end if;
  return jsonb_build_object(
    'runId', v_row.run_id,
    'cancelled', {schema}.settle_run(
      v_row.run_id, null, 'cancelled', null, null, 'run.cancelled',
      {schema}.terminal_fact('cancelled', v_row.run_id, null, null, 'client', p_reason),
      null) is not null,
    'status', 'cancelled');
end;
$$;
