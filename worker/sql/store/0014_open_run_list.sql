-- The lanes page lists each lane's newest open runs (report_open_runs), and a run's
-- bucket is named in one place for the report's counts and that list.
--
-- Number 0014: 0013 is another change's. The runner applies whatever this build
-- ships that the store lacks, in order, so a store may record 0014 before 0013.

-- The newest open runs of an effective lane (the adopter's, else the run's queue),
-- newest first, read 50 at a time per lane: without it the page sorted every open
-- run of a lane (80 ms for a 160,000-run backlog, against 0.1 ms with it).
create index runs_effective_lane_open_newest_idx
  on {schema}.runs ((coalesce(adopted_queue, queue)), created_at desc, run_id)
  where status not in ('completed', 'failed', 'cancelled');

-- The drain report's bucket of an open run: in flight, retrying, fresh (never
-- claimed), handed back (queued again after a claim), parked in a sleep, or
-- parked in another wait (an integration event, a detached runner).
create function {schema}.open_run_bucket(p_status text, p_attempt_id bigint, p_wait jsonb)
  returns text
  language sql
  immutable
  parallel safe
as $$
  select case when p_status = 'running' then 'inFlight'
              when p_status = 'retrying' then 'retrying'
              when p_status = 'queued' and p_attempt_id is null then 'fresh'
              when p_status = 'queued' then 'handedBack'
              when p_wait->>'kind' = 'sleep' then 'parkedSleep'
              else 'parkedEvent' end
$$;
