-- Store queries of the drain report, read in one snapshot by worker/ops/report.py
-- (worker/db/store/report.py).
-- Each starts with a `-- name: <name>` line and is run by one typed method.
-- `{schema}` is the store schema and `{checkpoints}` a queue's engine checkpoint
-- table, quoted when the text is filled in (worker/db/sql.py). Values are always
-- bound parameters.
--
-- The reads that touch what a viewer may not read (the engine's tables, runs'
-- current_wait) are SECURITY DEFINER functions of store migration 0049, whose
-- bodies are these queries as they were: every role reads the same numbers.

-- name: report_lanes
-- The drain report's lanes: every registered lane, its live workers (worker_live:
-- a heartbeat within 60 s, no stop mark) with the plays each registers, its
-- machine, its build's version (null: a build before 0.2.0) and its loops that
-- do not claim (migration 0021; null while all claim). A
-- pruned lane is `hidden` from the list while no open run names it (`lanes
-- show` and `lanes wait` still find it: drained, safe to stop, pruned).
select * from {schema}.report_lanes_v1();

-- name: report_runs
-- The drain report's runs: open runs only (the partial indexes), grouped by
-- effective lane (the adopter's, else the run's queue), by bucket, and by
-- whether only that lane's release may run them. needs_own is the rule of
-- lane_needs_own(), row by row: the two must agree, or a lane could read
-- drained while the report still lists a blocker.
select * from {schema}.report_runs_v1();

-- name: report_open_runs
-- The newest open runs ($2 at most) of each effective lane in $1, newest first
-- (runs_effective_lane_open_newest_idx, migration 0014): what the lanes page lists.
select * from {schema}.report_open_runs_v1($1::text[], $2);

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
select * from {schema}.report_foreign_tasks_v1($1::text[]);
