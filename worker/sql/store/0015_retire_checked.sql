-- The scaler retires what the current release supersedes only if the release
-- it saw ready is still the current one, as deployed when it looked. A pass
-- reads the registry, then the backend (seconds on Fly); a deploy that lands
-- in between (a new release, or the same one on a new image) must not have its
-- predecessors retired on the strength of machines that are not its own.
-- Returns the releases it retired; none when the registry moved on.
create or replace function {schema}.retire_superseded_by(
  p_actor text, p_current text, p_deployed_at timestamptz)
  returns text[]
  language plpgsql
as $$
begin
  -- The same lock deploy_release and retire_superseded take: no deploy can land
  -- between this check and the retirement.
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  if not exists (select 1 from {schema}.deployments d
                  where d.role = 'current' and d.release_id = p_current
                    and d.deployed_at = p_deployed_at) then
    return '{}';
  end if;
  return {schema}.retire_superseded(p_actor);
end;
$$;
