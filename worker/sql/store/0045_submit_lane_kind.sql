-- A submit never puts a run on a lane of the other kind. A worktree's release id
-- (`dev-<suffix>`) and a deploy's may name one queue (suffix `foo` and release
-- `foo` both give `runs_foo`). Boot refuses the second kind of worker there (the
-- boundary fix of 2026-12-07), but a worktree app could still submit `dev-foo`
-- runs onto release foo's queue, where the release's workers ran them on its code
-- (the lane guard compares queues, which are equal), and the reverse. Found by the
-- boundary review of 2026-12-07.
--
-- checked_release (0025), which every submit (submit_run, submit_runs: each item)
-- asks before it writes anything, now also refuses, 22023, a release id whose kind
-- (dev or release) is not the kind every spelling registered for its queue has. An
-- unregistered lane, or one older builds mixed (0035 keeps it apart), is left as
-- before. It reads the lane registry, so it is stable now, not immutable.
create or replace function {schema}.checked_release(
  p_release_id text, out release_id text, out queue text)
  language plpgsql
  stable
as $$
declare
  v_ids text[];
  v_dev boolean;
begin
  release_id := {schema}.lane_trim(coalesce(p_release_id, ''));
  if char_length(release_id) > 200 then
    -- The boot guard's limit: no worker could serve a longer one.
    raise exception 'release id % is over 200 characters: no worker can serve its lane.',
      quote_literal(left(release_id, 100)) || '...'
      using errcode = '22023';
  end if;
  queue := {schema}.queue_for_release(release_id);
  select l.release_ids into v_ids from {schema}.releases l where l.queue = checked_release.queue;
  if v_ids is null or cardinality(v_ids) = 0 then
    return;
  end if;
  v_dev := {schema}.lane_is_dev(array[release_id]);
  if v_dev and not {schema}.lane_is_dev(v_ids) then
    raise exception 'release id % is a worktree''s (dev) lane, but its queue % is release %''s lane: its runs would run on that release''s code; give the worktree another DEEPLINE_ABSURD_QUEUE_SUFFIX (its queue is runs_<suffix>).',
      quote_literal(release_id), queue, quote_literal(v_ids[1])
      using errcode = '22023';
  end if;
  if not v_dev and not exists (select 1 from unnest(v_ids) r
                                where not {schema}.lane_is_dev(array[r])) then
    raise exception 'release id % names queue %, which is worktree lane %''s: its runs would run on the worktree''s code; deploy and submit under another release id.',
      quote_literal(release_id), queue, quote_literal(v_ids[1])
      using errcode = '22023';
  end if;
end;
$$;
