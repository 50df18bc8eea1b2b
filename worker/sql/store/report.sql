-- Store queries of the drain report, read in one snapshot by worker/ops/report.py
-- (worker/db/store/report.py).
-- Each starts with a `-- name: <name>` line and is run by one typed method.
-- `{schema}` is the store schema and `{checkpoints}` a queue's engine checkpoint
-- table, quoted when the text is filled in (worker/db/sql.py). Values are always
-- bound parameters.

-- name: report_lanes
-- The drain report's lanes: every registered lane, its live workers (worker_live:
-- a heartbeat within 60 s, no stop mark) with the plays each registers, its
-- machine, its build's version (null: a build before 0.2.0) and its loops that
-- do not claim (migration 0021; null while all claim). A
-- pruned lane is `hidden` from the list while no open run names it (`lanes
-- show` and `lanes wait` still find it: drained, safe to stop, pruned).
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
 order by l.created_at, l.queue;

-- name: report_runs
-- The drain report's runs: open runs only (the partial indexes), grouped by
-- effective lane (the adopter's, else the run's queue), by bucket, and by
-- whether only that lane's release may run them. needs_own is the rule of
-- lane_needs_own(), row by row: the two must agree, or a lane could read
-- drained while the report still lists a blocker.
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
 group by lane, bucket, needs_own, claiming_stamp;

-- name: report_open_runs
-- The newest open runs ($2 at most) of each effective lane in $1, newest first
-- (runs_effective_lane_open_newest_idx, migration 0014): what the lanes page lists.
select l.lane, r.run_id, r.play, r.status,
       {schema}.open_run_bucket(r.status, r.current_attempt_id, r.current_wait) as bucket,
       r.attempts, r.defer_count, r.created_at, r.updated_at
  from unnest($1::text[]) as l(lane)
  cross join lateral (
    select * from {schema}.runs r
     where coalesce(r.adopted_queue, r.queue) = l.lane
       and r.status not in ('completed', 'failed', 'cancelled')
     order by r.created_at desc, r.run_id
     limit $2) r
 order by l.lane, r.created_at desc, r.run_id;

-- name: report_adopted
-- Open runs adopted away from their stamped lane, per (stamped lane, adopter).
select queue, adopted_queue, count(*) as runs
  from {schema}.runs
 where status not in ('completed', 'failed', 'cancelled')
   and adopted_queue is not null and adopted_queue <> queue
 group by queue, adopted_queue;

-- name: report_deliveries
-- Ledger facts not delivered to their run's runtime API, per stamped lane:
-- waiting (pending) and given up (failed). Information, never a drain blocker.
select r.queue,
       count(*) filter (where l.delivery = 'pending') as pending,
       count(*) filter (where l.delivery = 'failed') as failed
  from {schema}.ledger l
  join {schema}.runs r on r.run_id = l.run_id
 where l.delivery in ('pending', 'failed')
 group by r.queue;

-- name: report_foreign_tasks
-- Per queue in $1 that holds any: the unfinished engine tasks this store did
-- not create (another system's on a shared queue; migration 0020). Read
-- outside the report's snapshot, a batch of queues per statement, so the locks
-- it takes on engine tables end with each statement.
select l.queue, f.foreign_tasks
  from unnest($1::text[]) as l(queue)
  cross join lateral {schema}.queue_open_tasks(l.queue) f
 where f.foreign_tasks > 0;
