-- A cancel racing a run's completion could deadlock (40P01): cancel_run_by
-- (0039) locked the store's run row, then the engine's (absurd.cancel_task),
-- while a completion (complete_attempt, write_completions) locks the engine's
-- rows first (absurd.complete_run, the engine's check), then the store's
-- (settle_run). Found by the attack round of 2026-12-07 (b).
--
-- One order for every transaction that locks both (docs/DESIGN.md, "Lock
-- order"): the engine's rows of the run's task first (its open runs in run id
-- order, then the task, as absurd.cancel_task and complete_run take them), the
-- store's run row after. cancel_run_by and signal_run (whose engine event wakes
-- the run's engine rows after its store lock) now keep to it; the Python paths
-- that lock a run then call the engine (`runs fail`, `lanes move`, a deferral or
-- a play failing the run for good) lock through run_row_engine_first.

-- Lock the engine rows of task p_task_id on queue p_queue, in the engine's order.
create or replace function {schema}.lock_engine_task(p_queue text, p_task_id uuid)
  returns void
  language plpgsql
as $$
begin
  execute format(
    'select 1 from absurd.%I where task_id = $1'
    ' and state not in (''completed'', ''failed'', ''cancelled'')'
    ' order by run_id for update', 'r_' || p_queue)
    using p_task_id;
  execute format('select 1 from absurd.%I where task_id = $1 for update', 't_' || p_queue)
    using p_task_id;
end;
$$;

-- run_row(p_run_id, p_lock) (0008) with the engine's rows of an open run locked
-- first: read unlocked, lock its task's engine rows, lock the store's row, and
-- read again when a `lanes move` gave it another task (or reopened it) meanwhile.
create or replace function {schema}.run_row_engine_first(
  p_run_id uuid, p_lock text default 'update')
  returns {schema}.runs
  language plpgsql
as $$
declare
  v_seen {schema}.runs;
  v_row {schema}.runs;
begin
  loop
    v_seen := {schema}.run_row(p_run_id);
    if v_seen.task_id is not null
       and v_seen.status not in ('completed', 'failed', 'cancelled') then
      perform {schema}.lock_engine_task(v_seen.queue, v_seen.task_id);
    end if;
    v_row := {schema}.run_row(p_run_id, p_lock);
    if v_row.status in ('completed', 'failed', 'cancelled')
       or (v_seen.status not in ('completed', 'failed', 'cancelled')
           and v_row.task_id is not distinct from v_seen.task_id
           and v_row.queue = v_seen.queue) then
      return v_row;
    end if;
  end loop;
end;
$$;

revoke execute on function {schema}.lock_engine_task(text, uuid) from public;
revoke execute on function {schema}.run_row_engine_first(uuid, text) from public;

-- cancel_run_by (0039), changed only where marked.
create or replace function {schema}.cancel_run_by(
  p_run_id uuid, p_reason text, p_source text)
  returns jsonb
  language plpgsql
as $$
declare
  v_row {schema}.runs;
begin
  if p_source is null or p_source not in ('client', 'operator') then
    raise exception 'a cancel''s source is client or operator, got %', p_source
      using errcode = '22023';
  end if;
  if char_length(p_reason) > 1000 then
    raise exception 'a cancel reason has at most 1000 characters.' using errcode = '22023';
  end if;
  -- Locked: a `lanes move` in progress gives the run a new engine task.
  -- 0048: the engine's rows first, as a completion takes them.
  v_row := {schema}.run_row_engine_first(p_run_id, 'update');
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
      {schema}.terminal_fact('cancelled', v_row.run_id, null, null, p_source, p_reason),
      null) is not null,
    'status', 'cancelled');
end;
$$;

-- signal_run (0008), changed only where marked: the engine rows of the run it
-- delivers to are locked before the store's rows (its emit_event wakes them).
create or replace function {schema}.signal_run(
  p_run_id uuid, p_event_key text, p_payload jsonb default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_row {schema}.runs;
  v_hops integer := 0;
  v_received timestamptz;
  v_result jsonb;
  v_seen {schema}.runs;  -- 0048
begin
  if p_event_key is null then
    raise exception 'signal needs an event key (a non-blank string).' using errcode = '22023';
  end if;
  perform {schema}.checked_key(p_event_key, 'an event key');
  perform {schema}.checked_size(coalesce(p_payload, 'null'::jsonb), 'the event''s payload');
  -- 0048: the run it reaches, read unlocked, has its engine rows locked first;
  -- read again (locked) until that is still the run it reaches, on that task.
  loop
    v_seen := {schema}.run_row(p_run_id);
    v_hops := 0;
    while v_seen.status in ('completed', 'failed', 'cancelled') and v_seen.retried_by is not null
          and v_hops < 100 loop
      v_hops := v_hops + 1;
      v_seen := {schema}.run_row(v_seen.retried_by);
    end loop;
    if v_seen.task_id is not null
       and v_seen.status not in ('completed', 'failed', 'cancelled') then
      perform {schema}.lock_engine_task(v_seen.queue, v_seen.task_id);
    end if;
    v_hops := 0;
  -- end 0048
  -- Locked (shared): a `lanes move` or `runs retry` of the run commits before
  -- this reads its queue, or waits until this has emitted there.
  v_row := {schema}.run_row(p_run_id, 'share');
  while v_row.status in ('completed', 'failed', 'cancelled') and v_row.retried_by is not null
        and v_hops < 100 loop
    v_hops := v_hops + 1;
    v_row := {schema}.run_row(v_row.retried_by, 'share');
  end loop;
  -- 0048
    exit when v_row.status in ('completed', 'failed', 'cancelled')
      or (v_row.run_id = v_seen.run_id
          and v_seen.status not in ('completed', 'failed', 'cancelled')
          and v_row.task_id is not distinct from v_seen.task_id
          and v_row.queue = v_seen.queue);
  end loop;
  -- end 0048
  v_result := jsonb_build_object('runId', p_run_id, 'eventKey', p_event_key,
                                 'deliveredTo', v_row.run_id);
  if v_row.status in ('completed', 'failed', 'cancelled') then
    if v_row.status = 'completed' then
      return v_result || jsonb_build_object('delivered', false, 'duplicate', false,
                                            'runEnded', v_row.status, 'deliveredTo', null,
                                            'keptForRetry', false);
    end if;
    -- Nothing waits for it now, but a retry of the run will (copy_signals).
    insert into {schema}.signals (run_id, event_key, payload)
    values (v_row.run_id, p_event_key, p_payload)
    on conflict (run_id, event_key) do nothing
    returning received_at into v_received;
    return v_result || jsonb_build_object('delivered', false, 'duplicate', v_received is null,
                                          'runEnded', v_row.status,
                                          'keptForRetry', v_received is not null);
  end if;
  insert into {schema}.signals (run_id, event_key, payload)
  values (v_row.run_id, p_event_key, p_payload)
  on conflict (run_id, event_key) do nothing
  returning received_at into v_received;
  if v_received is null then
    return v_result || jsonb_build_object('delivered', false, 'duplicate', true,
                                          'runEnded', null, 'keptForRetry', false);
  end if;
  perform absurd.emit_event(v_row.queue, 'evt:' || v_row.run_id || ':' || p_event_key, p_payload);
  perform pg_notify('lane_worker_' || v_row.queue, v_row.run_id::text);
  return v_result || jsonb_build_object('delivered', true, 'duplicate', false,
                                        'runEnded', null, 'keptForRetry', false);
end;
$$;

-- As 0041: create or replace reset what it had set.
alter function {schema}.signal_run(uuid, text, jsonb)
  security definer set search_path = pg_catalog, pg_temp;
