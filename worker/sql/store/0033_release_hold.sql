-- A hold on the release registry (issue 32, manual control): while held, the
-- scaler changes no current release (it retires nothing a ready release
-- supersedes; it still replaces dead machines and destroys drained ones), and a
-- deploy or rollback by hand is refused unless forced. One row: the hold, who
-- placed it, when and why. Held and resumed are recorded as deployment events
-- (release_id '': the whole registry).
create table {schema}.release_hold (
  singleton boolean primary key default true check (singleton),
  held_at timestamptz not null default now(),
  held_by text not null,
  reason text
);

-- Every function below takes the lock deploy_release and retire_superseded
-- take, so a hold, a deploy and a retirement are ordered, never interleaved.

-- Place the hold (again: kept as it was, said as it is). Returns the hold.
create or replace function {schema}.hold_releases(p_actor text, p_reason text)
  returns jsonb
  language plpgsql
as $$
declare
  v_hold {schema}.release_hold;
begin
  if char_length(p_reason) > 1000 then
    raise exception 'a hold''s reason has at most 1000 characters.' using errcode = '22023';
  end if;
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  insert into {schema}.release_hold (held_by, reason)
  values (coalesce(p_actor, 'unknown'), p_reason)
  on conflict (singleton) do nothing
  returning * into v_hold;
  if found then
    insert into {schema}.deployment_events (release_id, action, actor, detail)
    values ('', 'held', v_hold.held_by, jsonb_build_object('reason', p_reason));
    return jsonb_build_object('held', true, 'heldBy', v_hold.held_by,
                              'heldAt', v_hold.held_at, 'reason', v_hold.reason,
                              'already', false);
  end if;
  select * into v_hold from {schema}.release_hold;
  return jsonb_build_object('held', true, 'heldBy', v_hold.held_by, 'heldAt', v_hold.held_at,
                            'reason', v_hold.reason, 'already', true);
end;
$$;

-- End the hold. Returns whether there was one.
create or replace function {schema}.resume_releases(p_actor text)
  returns boolean
  language plpgsql
as $$
declare
  v_hold {schema}.release_hold;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  delete from {schema}.release_hold returning * into v_hold;
  if not found then
    return false;
  end if;
  insert into {schema}.deployment_events (release_id, action, actor, detail)
  values ('', 'resumed', coalesce(p_actor, 'unknown'),
          jsonb_build_object('heldBy', v_hold.held_by, 'heldAt', v_hold.held_at));
  return true;
end;
$$;

-- Refuse (55000, object not in prerequisite state) while the registry is held,
-- unless p_force; the hold's words.
create or replace function {schema}.refuse_if_held(p_what text, p_force boolean)
  returns void
  language plpgsql
as $$
declare
  v_hold {schema}.release_hold;
begin
  select * into v_hold from {schema}.release_hold;
  if found and not coalesce(p_force, false) then
    raise exception '% refused: releases are held by % since % (%); `lane-worker releases resume` ends the hold, or pass --force.',
      p_what, v_hold.held_by, to_char(v_hold.held_at at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'),
      coalesce('reason: ' || v_hold.reason, 'no reason given')
      using errcode = '55000';
  end if;
end;
$$;

-- deploy_release (0012), refused while held unless p_force.
create or replace function {schema}.deploy_release_checked(
  p_release_id text, p_image text, p_desired integer, p_actor text, p_action text,
  p_force boolean)
  returns jsonb
  language plpgsql
as $$
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  perform {schema}.refuse_if_held(
    case p_action when 'rolled_back' then 'the rollback to ' else 'the deploy of ' end
      || coalesce(p_release_id, ''), p_force);
  return {schema}.deploy_release(p_release_id, p_image, p_desired, p_actor, p_action);
end;
$$;

-- retire_superseded_by (0015), nothing retired while held: the scaler's
-- retirement of what a ready release supersedes waits for the resume.
create or replace function {schema}.retire_superseded_unless_held(
  p_actor text, p_current text, p_deployed_at timestamptz)
  returns text[]
  language plpgsql
as $$
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  if exists (select 1 from {schema}.release_hold) then
    return '{}';
  end if;
  return {schema}.retire_superseded_by(p_actor, p_current, p_deployed_at);
end;
$$;
