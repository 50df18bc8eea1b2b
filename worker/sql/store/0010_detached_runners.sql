-- Detached runners (`ctx.run_detached`): work a run starts elsewhere and parks
-- on until the runner reports. Each launch is a runner attempt, numbered per
-- run (1, 2, 3 ... across all of the run's detached calls), and the run parks
-- on the engine event `runner-terminal:<runId>:<runnerAttempt>`. The result is
-- stored here (the authoritative payload, like a signal row); the event only
-- wakes the run. Attempt-scoped on purpose: engine events are first-emit-wins
-- per queue, so a late report of an old attempt names an event nobody waits
-- on and can never wake, or overwrite, a newer one.

create table {schema}.runner_attempts (
  run_id uuid not null references {schema}.runs (run_id) on delete cascade,
  runner_attempt integer not null check (runner_attempt >= 1),
  name text not null,
  -- launched: its run waits for it (or will); resolved: the run took its result;
  -- timed_out: the wait's deadline came first; superseded: the launch step ran
  -- again (a crash before it committed) and a newer attempt replaced it.
  state text not null default 'launched'
    check (state in ('launched', 'resolved', 'timed_out', 'superseded')),
  launched_at timestamptz not null default now(),
  result jsonb,
  reported_at timestamptz,
  resolved_at timestamptz,
  primary key (run_id, runner_attempt)
);

-- A new runner attempt of run p_run_id for its detached call p_name: the next
-- number of the run; an earlier launch of the same call that nobody resolved is
-- superseded. Serialized on the run's row.
create or replace function {schema}.begin_runner_attempt(p_run_id uuid, p_name text)
  returns integer
  language plpgsql
as $$
declare
  v_next integer;
begin
  perform 1 from {schema}.runs where run_id = p_run_id for update;
  if not found then
    raise exception 'no run % in store %', p_run_id, trim(both '"' from '{schema}')
      using errcode = 'P0002';
  end if;
  update {schema}.runner_attempts
     set state = 'superseded', resolved_at = now()
   where run_id = p_run_id and name = p_name and state = 'launched';
  select coalesce(max(runner_attempt), 0) + 1 into v_next
    from {schema}.runner_attempts where run_id = p_run_id;
  insert into {schema}.runner_attempts (run_id, runner_attempt, name)
  values (p_run_id, v_next, p_name);
  return v_next;
end;
$$;

-- A runner reports its result. The first report of an attempt is recorded
-- (a repeat changes nothing: `duplicate`); it wakes the run only while the run
-- still waits for that attempt, else it is recorded and ignored (`woke` false,
-- `reason` says why).
create or replace function {schema}.report_runner_result(
  p_run_id uuid, p_runner_attempt integer, p_result jsonb default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_attempt {schema}.runner_attempts;
  v_run {schema}.runs;
  v_said jsonb := jsonb_build_object('runId', p_run_id, 'runnerAttempt', p_runner_attempt);
begin
  if p_runner_attempt is null then
    raise exception 'a runner attempt is required (1, 2, ...).' using errcode = '22023';
  end if;
  perform {schema}.checked_size(coalesce(p_result, 'null'::jsonb), 'the runner''s result');
  -- The run first (shared), then the attempt: the order every writer takes.
  v_run := {schema}.run_row(p_run_id, 'share');
  select * into v_attempt from {schema}.runner_attempts
   where run_id = p_run_id and runner_attempt = p_runner_attempt
   for update;
  if not found then
    raise exception 'run % has no runner attempt %', p_run_id, p_runner_attempt
      using errcode = 'P0002';
  end if;
  if v_attempt.reported_at is not null then
    return v_said || jsonb_build_object('recorded', false, 'duplicate', true, 'woke', false,
                                        'reason', 'this runner attempt reported already');
  end if;
  update {schema}.runner_attempts
     set result = coalesce(p_result, 'null'::jsonb), reported_at = now()
   where run_id = p_run_id and runner_attempt = p_runner_attempt;
  if v_attempt.state <> 'launched' or v_run.status in ('completed', 'failed', 'cancelled') then
    return v_said || jsonb_build_object(
      'recorded', true, 'duplicate', false, 'woke', false,
      'reason', case
        when v_attempt.state = 'timed_out' then 'its wait timed out before the report'
        when v_attempt.state = 'superseded' then 'a newer runner attempt replaced it'
        when v_attempt.state = 'resolved' then 'the run already resumed from it'
        else format('the run has ended (%s)', v_run.status) end);
  end if;
  perform absurd.emit_event(
    v_run.queue, 'runner-terminal:' || p_run_id || ':' || p_runner_attempt, null);
  perform pg_notify('lane_worker_' || v_run.queue, p_run_id::text);
  return v_said || jsonb_build_object('recorded', true, 'duplicate', false, 'woke', true,
                                      'reason', null);
end;
$$;
