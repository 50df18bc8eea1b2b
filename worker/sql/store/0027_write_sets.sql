-- Group commit, set-based (issue 30): a batch's checkpoints and completions
-- as typed arrays, each kind written by a constant number of statements per
-- queue, instead of write_batch's (0018) engine call and subtransaction per
-- write. write_batch stays for the builds that call it.
--
-- Both functions answer the positions (0-based, in the arrays' order) of the
-- writes that failed, with their SQLSTATE, and write nothing of those: the
-- worker sends such a write again alone, through the engine's function or
-- complete_attempt (0016), which raises the error its caller acts on. A
-- write whose rows another transaction holds locked past p_lock_wait_ms
-- fails with 55P03 alone: the set-based pass is then undone and every write
-- of the batch goes one by one, each in a subtransaction of its own, as
-- write_batch does, so one blocked run never holds the others.

-- The checkpoints of a batch (lane_worker.checkpoints_set_v1 per queue).
create or replace function {schema}.write_checkpoints(
  p_lock_wait_ms integer, p_queues text[], p_tasks uuid[], p_names text[],
  p_states jsonb[], p_runs uuid[], p_extend_s integer[])
  returns table (write_at integer, error_code text)
  language plpgsql
as $$
declare
  v_queue text;
  v_failed_at integer[] := '{}';
  v_failed_code text[] := '{}';
  v_at integer;
  v_code text;
begin
  if coalesce(cardinality(p_queues), 0) = 0 then
    return;
  end if;
  perform set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
  begin
    for v_queue in select distinct q from unnest(p_queues) as q loop
      for v_at, v_code in
        select c.at, c.error_code
          from lane_worker.checkpoints_set_v1(v_queue, p_queues, p_tasks, p_names, p_states,
                                              p_runs, p_extend_s) c
      loop
        v_failed_at := v_failed_at || v_at;
        v_failed_code := v_failed_code || v_code;
      end loop;
    end loop;
  exception when lock_not_available then
    v_failed_at := '{}';
    v_failed_code := '{}';
    for v_at in 1 .. cardinality(p_queues) loop
      begin
        perform absurd.set_task_checkpoint_state(
          p_queues[v_at], p_tasks[v_at], p_names[v_at], p_states[v_at], p_runs[v_at],
          p_extend_s[v_at]);
      exception when others then
        get stacked diagnostics v_code = returned_sqlstate;
        v_failed_at := v_failed_at || (v_at - 1);
        v_failed_code := v_failed_code || v_code;
      end;
    end loop;
  end;
  return query select f.at, f.code from unnest(v_failed_at, v_failed_code) as f(at, code);
end;
$$;

-- The completions of a batch: for each, complete_attempt (0016) as a set. The
-- engine's check comes first (its refusal is the one reported, as
-- complete_attempt raises it first), then the store's fence (LW001: a newer
-- claim owns the run, or it is settled), then what both allow is written: the
-- engine's run and task, the store's settle (settle_run, 0008) with its
-- terminal fact, and the attempt's end.
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
             p_facts[i] as fact
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
