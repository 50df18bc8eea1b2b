-- A run of a play no worker of its lane ever registered is no longer failed at
-- once: a worker of the lane puts it back (no attempt spent) until a worker that
-- registers the play starts, for up to LANE_WORKER_UNKNOWN_PLAY_GRACE (the
-- worker's setting, 10 minutes by default), and only then fails it for good as an
-- unknown play. A hotfix that adds a play reaches the lane's machines one at a
-- time; its first runs must not fail on the machines not yet replaced (found by
-- the new-user walk of 2026-12-07). The warning says so. Same function, same
-- signature: only the sentence changes.
create or replace function {schema}.play_warning(p_queue text, p_play text, p_live jsonb)
  returns jsonb
  language sql
  immutable
as $$
  select case
    when p_live is null or jsonb_typeof(p_live) <> 'array' or p_live ? p_play then '{}'::jsonb
    else jsonb_build_object('playServed', false, 'warning', format(
      'no live worker of lane %s registers play %s (they register %s): a worker of the lane puts the run back (no attempt spent) until one that registers the play starts; if no worker of the lane ever registered it, the run fails for good as an unknown play after LANE_WORKER_UNKNOWN_PLAY_GRACE (10 minutes by default); check the play''s name and the app the lane''s workers load.',
      p_queue, quote_literal(left(p_play, 200)),
      case when jsonb_array_length(p_live) <= 20
             then (select string_agg(e, ', ' order by n)
                     from jsonb_array_elements_text(p_live) with ordinality x(e, n))
           else (select string_agg(e, ', ' order by n)
                   from jsonb_array_elements_text(p_live) with ordinality x(e, n)
                  where n <= 20)
                || format(' and %s more', jsonb_array_length(p_live) - 20) end))
  end
$$;
