-- A deploy or rollback forced through a release hold (`--force`) was recorded
-- like any other: the timeline (/deploys, `releases`) could not show that the
-- hold was overridden, nor whose hold. Found by the attack round of 2026-12-07.
-- The event the deploy wrote now carries `forcedThroughHold` (the hold's
-- holder and reason). Same signature as 0033's and 0034's (whose pass through the
-- deployments_held trigger for a forced call it keeps), so every caller keeps working.
create or replace function {schema}.deploy_release_checked(
  p_release_id text, p_image text, p_desired integer, p_actor text, p_action text,
  p_force boolean)
  returns jsonb
  language plpgsql
as $$
declare
  v_hold {schema}.release_hold;
  v_said jsonb;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  perform {schema}.refuse_if_held(
    case p_action when 'rolled_back' then 'the rollback to ' else 'the deploy of ' end
      || coalesce(p_release_id, ''), p_force);
  select * into v_hold from {schema}.release_hold;
  perform set_config('lane_worker.hold_forced', case when p_force then 'on' else '' end, true);
  v_said := {schema}.deploy_release(p_release_id, p_image, p_desired, p_actor, p_action);
  perform set_config('lane_worker.hold_forced', '', true);
  if v_hold.held_by is not null then
    -- The event deploy_release just wrote, in this transaction, under the deploy lock.
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
