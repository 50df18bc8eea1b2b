-- Run safety. Additive: builds before this one ignore the new columns.
--
-- adopted_queue: the lane queue of the release that adopted the run. The
-- continuation claim skips a run whose adopter's lane still claims (unless the
-- claimer is that adopter), so an adopted run is never taken by a third release.
alter table {schema}.runs add column adopted_queue text;

-- step_keys: how this run's step names map to engine checkpoints. NULL is the
-- first mapping (a name containing '#' could collide with a repeated name); 2
-- escapes '#'. Stamped by the first attempt that executes the run, so a run
-- keeps the mapping its committed steps were written with.
alter table {schema}.runs add column step_keys smallint;

-- Adopters registered their lane before adopting, under the spelling they stamped.
update {schema}.runs r
   set adopted_queue = l.queue
  from {schema}.releases l
 where r.adopted_release_id is not null
   and r.adopted_release_id = any(l.release_ids);

-- current_wait now names the wait a run is parked in right now, or nothing.
update {schema}.runs
   set current_wait = null
 where current_wait is not null and status <> 'waiting';

-- A retired lane drains while it holds an open run that only its release may
-- run: its effective lane (the adopter's, else the run's queue) and not parked.
create index runs_effective_lane_open_idx
  on {schema}.runs ((coalesce(adopted_queue, queue)), status, play)
  where status not in ('completed', 'failed', 'cancelled');

-- The plays each worker's app registers (written with every heartbeat): a
-- continuation loop adopts only runs whose play its own app registers, so a
-- parked run that no claiming release can adopt stays its own lane's work.
alter table {schema}.workers add column plays text[] not null default '{}';

-- The plays that live workers of claiming lanes newer than p_lane register:
-- what could adopt a parked run of lane p_lane. Lanes are ordered by their
-- first registration (a release never adopts from a newer one), and liveness
-- is a heartbeat within 60 s.
create function {schema}.adoptable_plays(p_lane text)
  returns text[]
  language sql
  stable
as $$
  select coalesce(array_agg(distinct play), '{}')
    from {schema}.workers w
    join {schema}.releases l on l.queue = w.queue
   cross join lateral unnest(w.plays) as play
   where l.status = 'claiming'
     and l.created_at > (select o.created_at from {schema}.releases o where o.queue = p_lane)
     and w.stopped_at is null
     and w.heartbeat_at > now() - interval '60 seconds'
$$;

-- Whether a live worker of a claiming lane other than p_lane registers p_play.
create function {schema}.play_adoptable(p_play text, p_lane text)
  returns boolean
  language sql
  stable
as $$
  select p_play = any ({schema}.adoptable_plays(p_lane))
$$;

-- Whether an open run on queue p_queue must be run by its effective lane
-- p_lane: anything not parked in a wait (fresh, running, retrying, handed
-- back), and a parked run that nothing could adopt: continuation loops adopt
-- only on a retired queue, and only a newer claiming release registering its
-- play. A retired lane holding one is draining.
create function {schema}.needs_own_lane(p_status text, p_play text, p_lane text, p_queue text)
  returns boolean
  language sql
  stable
as $$
  select p_status not in ('completed', 'failed', 'cancelled')
     and (p_status <> 'waiting'
          or not {schema}.play_adoptable(p_play, p_lane)
          or not exists (select 1 from {schema}.releases q
                          where q.queue = p_queue and q.status = 'retired'))
$$;

-- Whether lane p_lane holds an open run that only its release may run (set-based:
-- the registry and `lanes` ask this of every lane, and a lane may hold many
-- parked runs). A retired lane that does is draining; one that does not, drained.
create function {schema}.lane_needs_own(p_lane text)
  returns boolean
  language sql
  stable
as $$
  select exists (
           select 1 from {schema}.runs r
            where coalesce(r.adopted_queue, r.queue) = p_lane
              and r.status in ('queued', 'running', 'retrying'))
      or exists (
           select 1 from {schema}.runs r
            where coalesce(r.adopted_queue, r.queue) = p_lane
              and r.status = 'waiting'
              and (r.play <> all ({schema}.adoptable_plays(p_lane))
                   or not exists (select 1 from {schema}.releases q
                                   where q.queue = r.queue and q.status = 'retired')))
$$;
