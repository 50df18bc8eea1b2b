-- The adoption rules, named once. The continuation claim filter
-- (lane_worker.lane_filter, mode 'adopt'), the lane registry a worker reads to
-- choose its continuation loops, and the drain verdict (adoptable_plays, hence
-- needs_own_lane and lane_needs_own) all ask these functions, so what a worker
-- watches, what it may take, and what keeps a lane draining cannot drift apart.

-- Releases roll forward: lane p_lane registered before lane p_than (a release
-- adopts only from older lanes, never from a newer one).
create or replace function {schema}.lane_older(p_lane text, p_than text)
  returns boolean
  language sql
  stable
as $$
  select exists (select 1 from {schema}.releases them, {schema}.releases me
                  where them.queue = p_lane and me.queue = p_than
                    and them.created_at < me.created_at)
$$;

-- Whether lane p_queue claims (its release is current, not retired).
create or replace function {schema}.lane_claims(p_queue text)
  returns boolean
  language sql
  stable
as $$
  select exists (select 1 from {schema}.releases l
                  where l.queue = p_queue and l.status = 'claiming')
$$;

-- Whether the claiming lane p_claimer, whose app registers p_plays, may take a
-- run of queue p_queue whose durable wait is over: a run it adopted earlier
-- (its own work, whatever its status), or a run parked in a wait that no
-- claiming lane adopted, of an older lane, whose play its app registers.
create or replace function {schema}.adoptable_by(
  p_status text, p_play text, p_adopted_queue text, p_queue text,
  p_claimer text, p_plays text[])
  returns boolean
  language sql
  stable
as $$
  select p_play = any (p_plays)
     and (p_adopted_queue = p_claimer
          or (p_status = 'waiting'
              and (p_adopted_queue is null or not {schema}.lane_claims(p_adopted_queue))
              and {schema}.lane_older(coalesce(p_adopted_queue, p_queue), p_claimer)))
$$;

-- The plays that could adopt a parked run of lane p_lane: those the live
-- workers of newer claiming lanes register (now through lane_older).
create or replace function {schema}.adoptable_plays(p_lane text)
  returns text[]
  language sql
  stable
as $$
  select coalesce(array_agg(distinct play), '{}')
    from {schema}.workers w
    join {schema}.releases l on l.queue = w.queue
   cross join lateral unnest(w.plays) as play
   where l.status = 'claiming'
     and {schema}.lane_older(p_lane, l.queue)
     and {schema}.worker_live(w.heartbeat_at, w.stopped_at)
$$;
