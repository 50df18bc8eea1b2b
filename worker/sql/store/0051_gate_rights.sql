-- The deploy gate (0050) with least roles, and a candidate that adopts nothing.
--
-- 1. 0050's functions were executable by PUBLIC, as every new function is: an app
--    role could promote or retire a candidate. Only the owner and the scaler role
--    (worker/db/roles.py SCALER_FUNCTIONS) may call them now.
-- 2. The scaler submits, follows and cancels the gate's runs; its role may not call
--    the SQL API (run_status would show it any run's output). These three run with
--    the owner's rights for gate runs only: the submit takes the play and input of the
--    undecided candidate's own gate (by index) and remembers the run on its row
--    (deployments.gate_runs); status and cancel take only runs so remembered (an app
--    may put any key on its own runs, so a key proves nothing). Each answers what the
--    API function it calls answers.
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

alter table {schema}.deployments
  -- The runs gate_submit_run made for this deployment's gate: the only runs the
  -- scaler may follow or cancel (a key alone proves nothing: an app may choose any).
  add column gate_runs uuid[] not null default '{}';

-- Gate run p_index of the candidate deployed at p_deployed_at: its play and input are
-- the deployment's own (p_key is the scaler's idempotency key for it, under the
-- release's gate prefix). submit_run's answer; the run is remembered as a gate run.
create or replace function {schema}.gate_submit_run(
  p_release_id text, p_deployed_at timestamptz, p_index integer, p_key text)
  returns jsonb
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
as $$
declare
  v_gate jsonb;
  v_said jsonb;
begin
  select d.gate -> p_index into v_gate
    from {schema}.deployments d
   where d.release_id = p_release_id and d.deployed_at = p_deployed_at
     and d.role = 'candidate' and d.gate_outcome is null
     and jsonb_typeof(d.gate) = 'array' and p_index >= 0;
  if v_gate is null or jsonb_typeof(v_gate) <> 'object'
     or p_key is null
     or left(p_key, length('lane-worker-gate:' || p_release_id || ':'))
        <> 'lane-worker-gate:' || p_release_id || ':' then
    raise exception 'only the gate runs of an undecided candidate deployment are submitted this way'
      using errcode = '42501';
  end if;
  v_said := {schema}.submit_run(v_gate ->> 'play', coalesce(nullif(v_gate -> 'input', 'null'::jsonb), '{}'::jsonb),
                                p_release_id, p_key, null, 1);
  update {schema}.deployments d
     set gate_runs = d.gate_runs || (v_said ->> 'runId')::uuid
   where d.release_id = p_release_id and d.deployed_at = p_deployed_at
     and not (v_said ->> 'runId')::uuid = any (d.gate_runs);
  return v_said;
end;
$$;

create or replace function {schema}.gate_run_status(p_run_id uuid)
  returns jsonb
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
as $$
begin
  if not exists (select 1 from {schema}.deployments d where p_run_id = any (d.gate_runs)) then
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
  if not exists (select 1 from {schema}.deployments d where p_run_id = any (d.gate_runs)) then
    raise exception 'run % is not a deploy gate''s run', p_run_id using errcode = '42501';
  end if;
  -- The operator's source: the scaler acts for whoever deployed with the gate.
  return {schema}.cancel_run_by(p_run_id, p_reason, 'operator');
end;
$$;

revoke execute on function {schema}.gate_submit_run(text, timestamp with time zone, integer, text)
  from public;
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
