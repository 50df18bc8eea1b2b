-- Two fixes the attack round of 2026-12-07 found.
--
-- The release hold (0033) held only this build's deploys and its scaler's
-- retirements: an older build's `releases deploy`, or its scaler, calls
-- deploy_release (0012) and retire_superseded (0012) directly, and made a release
-- current or retired one through the hold. Those two functions are the only
-- writers of `deployments`: a trigger there now refuses every change while held,
-- whoever's build calls, unless the transaction forced it (`--force`, through
-- deploy_release_checked). Found by the attack round of 2026-12-07.
create or replace function {schema}.deployments_held()
  returns trigger
  language plpgsql
as $$
begin
  if coalesce(current_setting('lane_worker.hold_forced', true), '') <> 'on' then
    perform {schema}.refuse_if_held(
      'this change of the release registry (a deploy, a rollback or a retirement)', false);
  end if;
  return new;
end;
$$;

create trigger deployments_held
  before insert or update on {schema}.deployments
  for each row execute function {schema}.deployments_held();

-- deploy_release_checked (0033): a forced deploy passes the trigger, for this
-- call only.
create or replace function {schema}.deploy_release_checked(
  p_release_id text, p_image text, p_desired integer, p_actor text, p_action text,
  p_force boolean)
  returns jsonb
  language plpgsql
as $$
declare
  v_said jsonb;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  perform {schema}.refuse_if_held(
    case p_action when 'rolled_back' then 'the rollback to ' else 'the deploy of ' end
      || coalesce(p_release_id, ''), p_force);
  perform set_config('lane_worker.hold_forced', case when p_force then 'on' else '' end, true);
  v_said := {schema}.deploy_release(p_release_id, p_image, p_desired, p_actor, p_action);
  perform set_config('lane_worker.hold_forced', '', true);
  return v_said;
end;
$$;

-- lane_served (0029): the registry's current release serves its lane only when it
-- runs machines. Deployed with 0, nothing boots for it (the scaler starts none), and
-- a submit was told `served` with no warning (the attack round of 2026-12-07).
create or replace function {schema}.lane_served(p_queue text, p_release_id text)
  returns jsonb
  language plpgsql
  stable
as $$
declare
  v_status text;
  v_release text;
  v_problem text;
  v_serves text;
  v_hint text := ' (worker_release_id(suffix, deploy version) gives the release id a worker serves)';
begin
  select l.status into v_status from {schema}.releases l where l.queue = p_queue;
  if v_status = 'claiming' then
    return '{"served": true}'::jsonb;
  end if;
  if exists (select 1 from {schema}.workers w
              where w.queue = p_queue and {schema}.worker_live(w.heartbeat_at, w.stopped_at))
     or exists (select 1 from {schema}.deployments d
                 where d.queue = p_queue and d.role = 'current' and d.desired > 0) then
    return '{"served": true}'::jsonb;
  end if;
  -- Not served (rare): what would serve it.
  v_release := {schema}.lane_trim(coalesce(p_release_id, ''));
  if v_status = 'retired' then
    return jsonb_build_object('served', false, 'warning', format(
      'lane %s (release %s) is retired and none of its workers is live: the run waits there until one starts or `lane-worker lanes activate %s` makes the lane claim again; to run it on the current release, submit it with that release''s id%s.',
      p_queue, quote_literal(v_release), v_release, v_hint));
  end if;
  if p_queue = 'runs' then
    v_serves := 'a worker with neither DEEPLINE_ABSURD_QUEUE_SUFFIX nor DEEPLINE_RUNTIME_DEPLOY_VERSION set';
  elsif left(v_release, 4) = 'dev-' then
    v_serves := format('a worker with DEEPLINE_ABSURD_QUEUE_SUFFIX=%s', substr(p_queue, 6));
  else
    v_problem := {schema}.deploy_version_problem(v_release);
    if v_problem is not null then
      return jsonb_build_object('served', false, 'warning', format(
        'no worker serves lane %s (release %s), and none can be deployed with that release id (%s): the run waits there; submit it with the release id a worker serves%s.',
        p_queue, quote_literal(v_release), v_problem, v_hint));
    end if;
    v_serves := format('a worker deployed with DEEPLINE_RUNTIME_DEPLOY_VERSION=%s',
                       v_release);
  end if;
  return jsonb_build_object('served', false, 'warning', format(
    'no worker serves lane %s (release %s): none registered it, none is live, and it is not the current deploy; the run waits there until %s starts%s.',
    p_queue, quote_literal(v_release), v_serves, v_hint));
end;
$$;
