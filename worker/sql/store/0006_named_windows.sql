-- The liveness window, named once: a worker is live while it has no stop mark
-- and its heartbeat is younger than 60 seconds (the daemon beats every few
-- seconds). Every store query and function asks this function; the two store
-- functions below that spelled the window out are redefined to ask it too.
-- (lane_worker.lane_filter, installed with the engine, keeps its own copy of the
-- window: it also serves stores that older builds migrated.)
create or replace function {schema}.worker_live(p_heartbeat_at timestamptz, p_stopped_at timestamptz)
  returns boolean
  language sql
  stable
as $$
  select p_stopped_at is null and p_heartbeat_at > now() - interval '60 seconds'
$$;

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
     and l.created_at > (select o.created_at from {schema}.releases o where o.queue = p_lane)
     and {schema}.worker_live(w.heartbeat_at, w.stopped_at)
$$;

create or replace function {schema}.attempt_worker_live(p_worker_id text)
  returns boolean
  language sql
  stable
as $$
  select exists (
    select 1 from {schema}.workers w
     where w.worker_id in (p_worker_id,
                           regexp_replace(p_worker_id, ':[^:]*:continuations$', ''))
       and {schema}.worker_live(w.heartbeat_at, w.stopped_at))
$$;
