-- Least privilege (issue 33, fourth step): the viewer and the scaler read the
-- drain report without reading what they may not.
--
-- The report reads the engine's queue list and a lane's engine tables (foreign
-- tasks), runs' current_wait (a payload column: it names the event awaited and
-- its parameters), and the sandbox cleanups' table: none of them the viewer's.
-- Each of the report's reads that touches them is one function here, run with
-- the owner's rights (SECURITY DEFINER, search_path pinned, every name
-- qualified), returning what the report printed before: lanes, counts, run
-- ids, plays, times; never an input, an output, a wait's body or a token.
-- The report (worker/sql/store/report.sql, sandboxes.sql) calls them for every
-- role, the owner included, so a viewer and the owner see the same numbers.
-- Each body is the report's query as it was (report.sql at store 0045),
-- unchanged. Not executable by PUBLIC; `lane-worker roles` grants them to the
-- viewer and the scaler (the worker has every function).

-- The report's functions are SQL functions naming the engine's absurd.queues: a store
-- may be installed before the engine (a schema of its own), and a SQL function's body
-- is checked when it is created. They are checked when called instead.
set local check_function_bodies = off;

create or replace function {schema}.report_lanes_v1()
  returns table (queue text, status text, release_ids text[], created_at timestamptz, retired_at timestamptz, release_id text, pruned_at timestamptz, hidden boolean, workers jsonb, last_seen timestamptz)
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
select l.queue, l.status, l.release_ids, l.created_at, l.retired_at,
       -- The lane's release id as deployed (migration 0030): what every view names it by.
       {schema}.lane_release_id(l.queue) as release_id,
       -- Pruned while its engine queue is gone: a submit or a boot made it again.
       case when exists (select 1 from absurd.queues q where q.queue_name = l.queue)
            then null else l.pruned_at end as pruned_at,
       l.pruned_at is not null
         and not exists (select 1 from {schema}.runs r
                          where coalesce(r.adopted_queue, r.queue) = l.queue
                            and r.status not in ('completed', 'failed', 'cancelled')) as hidden,
       coalesce((select jsonb_agg(jsonb_build_object('workerId', w.worker_id,
                                                     'plays', to_jsonb(w.plays),
                                                     'machineId', w.machine_id,
                                                     'version', w.version,
                                                     -- As its text: Python decodes each alone
                                                     -- (worker/ops/workers.py), so one it
                                                     -- cannot read fails only that worker.
                                                     'claimFailures', w.claim_failures::text)
                                  order by w.worker_id)
                   from {schema}.workers w
                  where w.queue = l.queue
                    and {schema}.worker_live(w.heartbeat_at, w.stopped_at)), '[]'::jsonb) as workers,
       -- When a worker of it was last seen (its newest heartbeat; workers_queue_live_idx),
       -- else when one last registered it: an idle dev lane says since when.
       greatest(l.updated_at, (select max(w.heartbeat_at) from {schema}.workers w
                                where w.queue = l.queue)) as last_seen
  from {schema}.releases l
 order by l.created_at, l.queue
$fn$;
revoke execute on function {schema}.report_lanes_v1() from public;

create or replace function {schema}.report_runs_v1()
  returns table (lane text, bucket text, needs_own boolean, runs bigint, run_ids uuid[], run_created timestamptz[], plays text[], oldest_update timestamptz, deferred bigint, oldest_deferral timestamptz, release_id text, claiming_stamp text)
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
with lane as (
  select l.queue, l.status, {schema}.adoptable_plays(l.queue) as plays
    from {schema}.releases l
), open as (
  select r.run_id, r.play, r.created_at, r.updated_at, r.defer_count, r.first_deferred_at,
         coalesce(r.adopted_queue, r.queue) as lane,
         case when r.adopted_queue is null then r.release_id end as stamped,
         -- Adopted, parked, and its stamped lane claims again (`lanes activate`
         -- after the adoption): no newer release may adopt it from there.
         case when r.adopted_queue is not null and r.adopted_queue <> r.queue
                   and r.status = 'waiting' and q.status = 'claiming'
              then r.queue end as claiming_stamp,
         {schema}.open_run_bucket(r.status, r.current_attempt_id, r.current_wait) as bucket,
         r.status <> 'waiting'
           or not coalesce(r.play = any (e.plays), false)
           or coalesce(q.status, '') <> 'retired' as needs_own
    from {schema}.runs r
    left join lane e on e.queue = coalesce(r.adopted_queue, r.queue)
    left join lane q on q.queue = r.queue
   where r.status not in ('completed', 'failed', 'cancelled')
)
select lane, bucket, needs_own, count(*) as runs,
       (array_agg(run_id order by created_at, run_id))[1:20] as run_ids,
       (array_agg(created_at order by created_at, run_id))[1:20] as run_created,
       array_agg(distinct play order by play) as plays,
       min(updated_at) as oldest_update,
       count(*) filter (where defer_count > 0) as deferred,
       min(first_deferred_at) as oldest_deferral,
       -- As deployed (migration 0030), once per group rather than per run.
       {schema}.release_as_deployed(min(stamped)) as release_id, claiming_stamp
  from open
 group by lane, bucket, needs_own, claiming_stamp
$fn$;
revoke execute on function {schema}.report_runs_v1() from public;

create or replace function {schema}.report_open_runs_v1(p_lanes text[], p_limit integer)
  returns table (lane text, run_id uuid, play text, status text, bucket text, attempts integer, defer_count integer, created_at timestamptz, updated_at timestamptz)
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
select l.lane, r.run_id, r.play, r.status,
       {schema}.open_run_bucket(r.status, r.current_attempt_id, r.current_wait) as bucket,
       r.attempts, r.defer_count, r.created_at, r.updated_at
  from unnest(p_lanes) as l(lane)
  cross join lateral (
    select * from {schema}.runs r
     where coalesce(r.adopted_queue, r.queue) = l.lane
       and r.status not in ('completed', 'failed', 'cancelled')
     order by r.created_at desc, r.run_id
     limit p_limit) r
 order by l.lane, r.created_at desc, r.run_id
$fn$;
revoke execute on function {schema}.report_open_runs_v1(text[], integer) from public;

create or replace function {schema}.report_foreign_tasks_v1(p_queues text[])
  returns table (queue text, foreign_tasks bigint)
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
select l.queue, f.foreign_tasks
  from unnest(p_queues) as l(queue)
  cross join lateral {schema}.queue_open_tasks(l.queue) f
 where f.foreign_tasks > 0
$fn$;
revoke execute on function {schema}.report_foreign_tasks_v1(text[]) from public;

create or replace function {schema}.report_cleanups_v1()
  returns table (queue text, pending bigint, failed bigint, failed_sandboxes text[])
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
select cleanup_queue as queue,
       count(*) filter (where cleanup = 'pending') as pending,
       count(*) filter (where cleanup = 'failed') as failed,
       coalesce(array_agg(sandbox_id order by sandbox_id)
                  filter (where cleanup = 'failed'), '{}') as failed_sandboxes
  from {schema}.run_sandboxes
 where cleanup in ('pending', 'failed')
 group by cleanup_queue
$fn$;
revoke execute on function {schema}.report_cleanups_v1() from public;

-- A run's status for the viewer and the scaler (`lane-worker status` as those
-- roles): what run_status returns less every payload: no output, no error, no
-- fact's delivery error (each may quote a run's data). Ids, status, lanes,
-- attempts, claims, step keys, facts' types and delivery states only.
create or replace function {schema}.run_status_bookkeeping_v1(p_run_id uuid)
  returns jsonb
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
select (s - 'output' - 'error')
       || pg_catalog.jsonb_build_object(
            'facts', coalesce((select pg_catalog.jsonb_agg(f #- '{delivery,error}' order by n)
                                 from pg_catalog.jsonb_array_elements(s -> 'facts')
                                      with ordinality as e(f, n)), '[]'::jsonb))
  from {schema}.run_status(p_run_id) as r(s)
$fn$;
revoke execute on function {schema}.run_status_bookkeeping_v1(uuid) from public;

-- The run page's extra row for the viewer: what its run waits for, as the short
-- fields `status` shows (kind, event key, sleep end, deadline, boundary: never
-- the wait's other contents), and its drain-report bucket while open.
create or replace function {schema}.run_page_bookkeeping_v1(p_run_id uuid)
  returns table (current_wait jsonb, bucket text)
  language sql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $fn$
select case when r.status = 'waiting' and pg_catalog.jsonb_typeof(r.current_wait) = 'object'
            then pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
                   'kind', r.current_wait ->> 'kind',
                   'eventKey', r.current_wait ->> 'eventKey',
                   'wakeAtMs', r.current_wait ->> 'wakeAtMs',
                   'deadlineMs', r.current_wait ->> 'deadlineMs',
                   'boundaryId', r.current_wait ->> 'boundaryId'))
       end,
       case when r.status not in ('completed', 'failed', 'cancelled')
            then {schema}.open_run_bucket(r.status, r.current_attempt_id, r.current_wait)
       end
  from {schema}.runs r
 where r.run_id = p_run_id
$fn$;
revoke execute on function {schema}.run_page_bookkeeping_v1(uuid) from public;
reset check_function_bodies;
