-- Run safety, round 3. Additive: builds before this one ignore the new column
-- and indexes.
--
-- A run is retried at most once: `runs retry` records the retry on the run it
-- repeats, under that row's lock, and a second `runs retry` of the same run
-- returns the retry it finds there. A signal to a retried run follows this
-- link to the retry.
alter table {schema}.runs add column if not exists retried_by uuid;

-- Stores retried twice by an older build: the first retry is the one the run names.
update {schema}.runs o
   set retried_by = f.run_id
  from (select distinct on (retry_of) retry_of, run_id
          from {schema}.runs
         where retry_of is not null
         order by retry_of, created_at, run_id) f
 where o.run_id = f.retry_of and o.retried_by is null;

-- Attempts that recorded no end: the maintenance pass closes those whose run
-- moved on (a newer attempt took it over, or it ended) and whose worker is gone.
create index if not exists attempts_open_idx on {schema}.attempts (run_id)
  where outcome is null;

-- Whether the worker that made an attempt is alive: a heartbeat within 60 s and
-- no stop mark. A continuation loop's worker id is its process's id plus
-- ':<queue>:continuations'; the process's row is the one that heartbeats.
create or replace function {schema}.attempt_worker_live(p_worker_id text)
  returns boolean
  language sql
  stable
as $$
  select exists (
    select 1 from {schema}.workers w
     where w.worker_id in (p_worker_id,
                           regexp_replace(p_worker_id, ':[^:]*:continuations$', ''))
       and w.stopped_at is null
       and w.heartbeat_at > now() - interval '60 seconds')
$$;
