-- The warning 0038 added to a submit whose play no live worker of the lane
-- registers said the run "waits there until a worker whose app registers it
-- starts". It does not: a worker of a lane none of whose workers ever registered
-- the play claims the run and fails it for good as an unknown play (decide():
-- PLAY_UNKNOWN); only a play some worker of the lane registered before is put
-- back until one that registers it is live. Found by the new-user walk of
-- 2026-12-07 (a hotfix's new play, a typo). Same function, same signature: only
-- the sentence changes. (The Python client rewrote 0038's sentence; it now
-- finds nothing to rewrite.)
create or replace function {schema}.play_warning(p_queue text, p_play text, p_live jsonb)
  returns jsonb
  language sql
  immutable
as $$
  select case
    when p_live is null or jsonb_typeof(p_live) <> 'array' or p_live ? p_play then '{}'::jsonb
    else jsonb_build_object('playServed', false, 'warning', format(
      'no live worker of lane %s registers play %s (they register %s): a worker of the lane claims the run and fails it for good as an unknown play, unless a worker of the lane registered the play before (then the run is put back until one that registers it is live); check the play''s name and the app the lane''s workers load.',
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
