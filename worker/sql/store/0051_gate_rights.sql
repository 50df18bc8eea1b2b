-- The deploy gate (0050) with least roles, and a candidate that adopts nothing.
--
-- 1. 0050's functions were executable by PUBLIC, as every new function is: an app
--    role could promote or retire a candidate. Only the owner and the scaler role
--    (worker/db/roles.py SCALER_FUNCTIONS) may call them now.
-- 2. The scaler submits, follows and cancels the gate's runs; its role may not call
--    the SQL API (run_status would show it any run's output). These three run with
--    the owner's rights for gate runs only: a key `lane-worker-gate:<release>:...` of
--    a release deployed as the candidate (submit), or a run whose key starts so
--    (status, cancel). Each answers what the API function it calls answers.
-- 3. A candidate's lane is not newer than anything until its gate passes: lane_older
--    (0035's body, one condition added) is false towards a lane the registry deploys
--    as the candidate, so its machines adopt no parked run of a draining release
--    (unproven code), attach no continuation loop, and count for no drain verdict.
--    Promoted (current), it adopts as any release does.

do $$
declare
  v_fn text;
begin
  foreach v_fn in array array[
    '{schema}.deploy_release_gated(text, text, integer, text, text, boolean, jsonb, double precision)',
    '{schema}.retire_candidate_lane(text, text)',
    '{schema}.gate_begun(text, timestamp with time zone)',
    '{schema}.gate_passed(text, text, timestamp with time zone, jsonb)',
    '{schema}.gate_failed(text, text, timestamp with time zone, text, text)']
  loop
    execute pg_catalog.format('revoke execute on function %s from public', v_fn);
  end loop;
end;
$$;

create or replace function {schema}.gate_submit_run(
  p_play text, p_input jsonb, p_release_id text, p_idempotency_key text)
  returns jsonb
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
as $$
begin
  if p_idempotency_key is null
     or left(p_idempotency_key, length('lane-worker-gate:' || coalesce(p_release_id, '') || ':'))
        <> 'lane-worker-gate:' || coalesce(p_release_id, '') || ':'
     or not exists (select 1 from {schema}.deployments d
                     where d.release_id = p_release_id and d.role = 'candidate') then
    raise exception 'only a candidate release''s gate runs are submitted this way'
      using errcode = '42501';
  end if;
  return {schema}.submit_run(p_play, p_input, p_release_id, p_idempotency_key, null, 1);
end;
$$;

create or replace function {schema}.gate_run_status(p_run_id uuid)
  returns jsonb
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
as $$
begin
  if not exists (select 1 from {schema}.runs r
                  where r.run_id = p_run_id and r.idempotency_key like 'lane-worker-gate:%') then
    raise exception 'run % is not a deploy gate''s run', p_run_id using errcode = '42501';
  end if;
  return {schema}.run_status(p_run_id);
end;
$$;

create or replace function {schema}.gate_cancel_run(p_run_id uuid, p_reason text)
  returns jsonb
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
as $$
begin
  if not exists (select 1 from {schema}.runs r
                  where r.run_id = p_run_id and r.idempotency_key like 'lane-worker-gate:%') then
    raise exception 'run % is not a deploy gate''s run', p_run_id using errcode = '42501';
  end if;
  -- The operator's source: the scaler acts for whoever deployed with the gate.
  return {schema}.cancel_run_by(p_run_id, p_reason, 'operator');
end;
$$;

revoke execute on function {schema}.gate_submit_run(text, jsonb, text, text) from public;
revoke execute on function {schema}.gate_run_status(uuid) from public;
revoke execute on function {schema}.gate_cancel_run(uuid, text) from public;

create or replace function {schema}.lane_older(p_lane text, p_than text)
  returns boolean
  language sql
  stable
as $$
  select exists (select 1 from {schema}.releases them, {schema}.releases me
                  where them.queue = p_lane and me.queue = p_than
                    and them.created_at < me.created_at
                    and not {schema}.lane_is_dev(them.release_ids)
                    and not {schema}.lane_is_dev(me.release_ids)
                    -- 0051: a gating candidate is not newer than anything yet
                    and not exists (select 1 from {schema}.deployments d
                                      where d.queue = me.queue and d.role = 'candidate'))
$$;
