-- A dev lane (a worktree's or a preview's: release id `dev` or `dev-<suffix>`)
-- stands apart from the roll-forward order. lane_older (0007) compared
-- registration times only, so a worktree worker registered after a release
-- lane counted as newer: once that release retired, its :continuations loop
-- adopted the release's parked runs and finished them on the worktree's code.
-- Found by the fresh-clone walk of 2026-12-07.
--
-- Adoption now holds only between two release lanes: a dev lane adopts nothing
-- and nothing adopts from it (its parked runs wait for its own worker). Every
-- reader asks this one function: the claim filter (adoptable_by, hence the
-- engine's lane_filter and the continuation claim), the lane registry a worker
-- reads to attach its continuation loops (older_than_mine), and the drain
-- verdict (adoptable_plays), so a release lane whose only newer lanes are dev
-- lanes keeps draining on its own machines instead of reading as drained.
-- A lane is a dev lane when any spelling a worker registered for it is one
-- (the registry's rule, 0012): a release and a dev suffix may share a queue.
create or replace function {schema}.lane_is_dev(p_release_ids text[])
  returns boolean
  language sql
  immutable
as $$
  select exists (select 1 from unnest(p_release_ids) r
                  where lower(r) = 'dev' or lower(left(r, 4)) = 'dev-')
$$;

create or replace function {schema}.lane_older(p_lane text, p_than text)
  returns boolean
  language sql
  stable
as $$
  select exists (select 1 from {schema}.releases them, {schema}.releases me
                  where them.queue = p_lane and me.queue = p_than
                    and them.created_at < me.created_at
                    and not {schema}.lane_is_dev(them.release_ids)
                    and not {schema}.lane_is_dev(me.release_ids))
$$;
