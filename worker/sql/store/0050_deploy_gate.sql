-- A gate before promotion (issue 32 §1): `releases deploy R --gate PLAY[=JSON]`.
--
-- A gated deploy records R as the `candidate`: the current release stays current
-- (its machines keep running, its lane keeps claiming) while the scaler starts R's
-- machines and, once they are ready, submits each gate run on R's lane and awaits
-- it. All passed within the gate's timeout: R is promoted (current; the former
-- current is `previous` and the scaler retires it as for any deploy). One failed
-- or timed out: R is retired (its lane drains, its machines go), never current,
-- and the outcome and reason are kept on its row. At most one candidate; any
-- later deploy abandons it. Every change here is conditional on the candidate's
-- deployed_at (the deployment), so a scaler SIGKILLed and restarted at any step
-- neither promotes a deployment whose gate did not pass nor judges a newer one.

alter table {schema}.deployments drop constraint deployments_role_check;
alter table {schema}.deployments
  add constraint deployments_role_check
    check (role in ('current', 'previous', 'retired', 'candidate')),
  -- [{"play": ..., "input": {...}}, ...]; null: an ungated deploy.
  add column gate jsonb,
  add column gate_timeout_s double precision,
  -- When the scaler first submitted the gate runs (their timeout runs from then).
  add column gate_started_at timestamptz,
  add column gate_outcome text check (gate_outcome in ('passed', 'failed', 'abandoned')),
  add column gate_reason text,
  add column gate_run text;  -- the gate run that failed or timed out
create unique index deployments_one_candidate on {schema}.deployments ((true))
  where role = 'candidate';

-- Retire the lane of p_release (p_queue) now, registered or not, so its machines
-- drain and go (a machine of it that boots later drains too): as retire_superseded
-- (0012) does for a previous release whose lane no worker registered yet.
create or replace function {schema}.retire_candidate_lane(p_release text, p_queue text)
  returns void
  language plpgsql
as $$
begin
  insert into {schema}.releases (queue, status, release_ids, retired_at)
  values (p_queue, 'retired', array[p_release], now())
  on conflict (queue) do update
     set status = 'retired', retired_at = coalesce({schema}.releases.retired_at, now()),
         updated_at = now();
  perform pg_notify('lane_worker_lanes', p_queue);
end;
$$;

-- Every deploy of this build: deploy_release_checked (0040, copied: the hold, its
-- forced mark), then (new) any other candidate is abandoned, and a gated deploy
-- (p_gate a non-empty array) leaves the current release current and records R as
-- the candidate with its gate.
create or replace function {schema}.deploy_release_gated(
  p_release_id text, p_image text, p_desired integer, p_actor text, p_action text,
  p_force boolean, p_gate jsonb, p_gate_timeout_s double precision)
  returns jsonb
  language plpgsql
as $$
declare
  v_hold {schema}.release_hold;
  v_said jsonb;
  v_release text := {schema}.lane_trim(coalesce(p_release_id, ''));
  v_gated boolean := p_gate is not null and jsonb_typeof(p_gate) = 'array'
                     and jsonb_array_length(p_gate) > 0;
  v_old record;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  perform {schema}.refuse_if_held(
    case p_action when 'rolled_back' then 'the rollback to ' else 'the deploy of ' end
      || coalesce(p_release_id, ''), p_force);
  -- (new) a gate judges a release that is not current yet.
  if v_gated and exists (select 1 from {schema}.deployments
                          where role = 'current' and release_id = v_release) then
    raise exception 'release % is the current release: a gate judges a release before it becomes current (deploy it without --gate).',
      quote_literal(v_release) using errcode = '22023';
  end if;
  if v_gated and coalesce(p_desired, 0) < 1 then
    raise exception 'a gated release needs at least 1 machine to run its gate on.'
      using errcode = '22023';
  end if;
  if v_gated and (p_gate_timeout_s is null or p_gate_timeout_s <= 0) then
    raise exception 'a gate timeout is a number of seconds above 0.' using errcode = '22023';
  end if;
  select * into v_hold from {schema}.release_hold;
  perform set_config('lane_worker.hold_forced', case when p_force then 'on' else '' end, true);
  v_said := {schema}.deploy_release(p_release_id, p_image, p_desired, p_actor, p_action);
  -- (new) an earlier candidate is abandoned: this deploy says what should run now.
  for v_old in
    select d.release_id, d.queue from {schema}.deployments d
     where d.role = 'candidate' and d.release_id <> v_release
  loop
    update {schema}.deployments
       set role = 'retired', retired_at = now(), retired_by = coalesce(p_actor, 'unknown'),
           gate_outcome = 'abandoned', gate_reason = 'superseded by the deploy of ' || v_release,
           updated_at = now()
     where release_id = v_old.release_id;
    perform {schema}.retire_candidate_lane(v_old.release_id, v_old.queue);
    insert into {schema}.deployment_events (release_id, action, actor, detail)
    values (v_old.release_id, 'gate_abandoned', coalesce(p_actor, 'unknown'),
            jsonb_build_object('queue', v_old.queue, 'supersededBy', v_release));
  end loop;
  update {schema}.deployments
     set gate = case when v_gated then p_gate end,
         gate_timeout_s = case when v_gated then p_gate_timeout_s end,
         gate_started_at = null, gate_outcome = null, gate_reason = null, gate_run = null
   where release_id = v_release;
  if v_gated then
    -- deploy_release demoted the current release: it stays current until the gate passes.
    update {schema}.deployments set role = 'candidate', updated_at = now()
     where release_id = v_release;
    update {schema}.deployments set role = 'current', updated_at = now()
     where release_id in (select jsonb_array_elements_text(v_said->'previous'));
    update {schema}.deployment_events e
       set detail = e.detail || jsonb_build_object(
             'gate', p_gate, 'gateTimeoutSeconds', p_gate_timeout_s,
             'previous', '[]'::jsonb, 'current', v_said->'previous')
     where e.event_id = (select max(x.event_id) from {schema}.deployment_events x
                          where x.release_id = v_release and x.action = p_action);
    v_said := v_said || jsonb_build_object(
      'gate', p_gate, 'gateTimeoutSeconds', p_gate_timeout_s, 'candidate', true,
      'current', v_said->'previous', 'previous', '[]'::jsonb);
  end if;
  perform set_config('lane_worker.hold_forced', '', true);
  if v_hold.held_by is not null then
    -- As 0040: the event deploy_release wrote, in this transaction, under the deploy lock.
    update {schema}.deployment_events e
       set detail = coalesce(e.detail, '{}'::jsonb) || jsonb_build_object(
             'forcedThroughHold',
             jsonb_build_object('heldBy', v_hold.held_by, 'reason', v_hold.reason))
     where e.event_id = (select max(x.event_id) from {schema}.deployment_events x
                          where x.action = p_action);
  end if;
  return v_said;
end;
$$;

-- The scaler begins the gate of the candidate p_release as deployed at p_deployed_at:
-- its clock starts once (a restarted scaler finds it started). Returns the seconds
-- since it started, on the database's clock; null when that deployment is no longer
-- a candidate to judge, or the registry is held (nothing changes then).
create or replace function {schema}.gate_begun(p_release text, p_deployed_at timestamptz)
  returns double precision
  language plpgsql
as $$
declare
  v_started timestamptz;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  if exists (select 1 from {schema}.release_hold) then
    return null;
  end if;
  update {schema}.deployments
     set gate_started_at = coalesce(gate_started_at, now())
   where release_id = p_release and role = 'candidate' and deployed_at = p_deployed_at
     and gate_outcome is null
  returning gate_started_at into v_started;
  if v_started is null then
    return null;
  end if;
  return extract(epoch from now() - v_started);
end;
$$;

-- Every gate run passed: the candidate becomes current (the current one before it
-- is `previous`: the scaler retires it, its machines ready). Only that deployment,
-- still undecided, deployed after the current release, and not while held.
create or replace function {schema}.gate_passed(
  p_actor text, p_release text, p_deployed_at timestamptz, p_runs jsonb)
  returns boolean
  language plpgsql
as $$
declare
  v_previous text[];
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  if exists (select 1 from {schema}.release_hold) then
    return false;
  end if;
  if not exists (select 1 from {schema}.deployments c
                  where c.release_id = p_release and c.role = 'candidate'
                    and c.deployed_at = p_deployed_at and c.gate_outcome is null
                    and not exists (select 1 from {schema}.deployments d
                                     where d.role = 'current' and d.deployed_at > c.deployed_at))
  then
    return false;
  end if;
  with demoted as (
    update {schema}.deployments set role = 'previous', updated_at = now()
     where role = 'current'
    returning release_id
  )
  select coalesce(array_agg(release_id), '{}') into v_previous from demoted;
  update {schema}.deployments
     set role = 'current', gate_outcome = 'passed', updated_at = now()
   where release_id = p_release;
  insert into {schema}.deployment_events (release_id, action, actor, detail)
  values (p_release, 'gate_passed', coalesce(p_actor, 'unknown'),
          jsonb_build_object('runs', p_runs, 'previous', to_jsonb(v_previous)));
  return true;
end;
$$;

-- A gate run failed or timed out: the candidate is retired (its lane drains, its
-- machines go), never current; the current release is untouched. Only that
-- deployment, still undecided, and not while held.
create or replace function {schema}.gate_failed(
  p_actor text, p_release text, p_deployed_at timestamptz, p_run text, p_reason text)
  returns boolean
  language plpgsql
as $$
declare
  v_queue text;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  if exists (select 1 from {schema}.release_hold) then
    return false;
  end if;
  update {schema}.deployments
     set role = 'retired', retired_at = now(), retired_by = coalesce(p_actor, 'unknown'),
         gate_outcome = 'failed', gate_reason = left(p_reason, 2000), gate_run = p_run,
         updated_at = now()
   where release_id = p_release and role = 'candidate' and deployed_at = p_deployed_at
     and gate_outcome is null
  returning queue into v_queue;
  if v_queue is null then
    return false;
  end if;
  perform {schema}.retire_candidate_lane(p_release, v_queue);
  insert into {schema}.deployment_events (release_id, action, actor, detail)
  values (p_release, 'gate_failed', coalesce(p_actor, 'unknown'),
          jsonb_build_object('run', p_run, 'error', left(p_reason, 2000), 'queue', v_queue));
  return true;
end;
$$;
