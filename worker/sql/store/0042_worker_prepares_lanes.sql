-- A worker connecting as its own role (issue 33: no DDL at run time) cannot
-- create its lane's engine queue nor the NOTIFY trigger on it: both are DDL in
-- the engine schema, which is the owner's. This function does both with the
-- owner's rights, as a worker running as the owner does them itself (the
-- queue as submit_run makes it, with lane-worker's cleanup policy and its
-- record; then lane_worker.watch_queue_v1's trigger). Executable by no one but
-- the owner and the roles granted it (`lane-worker roles`: the worker).
-- Returns whether the trigger was installed by this call.
create or replace function {schema}.prepare_lane_queue(p_queue text)
  returns boolean
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
as $$
begin
  if p_queue is null or p_queue = '' then
    raise exception 'a lane''s queue name is required' using errcode = '22023';
  end if;
  perform {schema}.ensure_lane_queue(p_queue);
  return lane_worker.watch_queue_v1(p_queue);
end;
$$;
revoke execute on function {schema}.prepare_lane_queue(text) from public;
