-- Store queries of the operator page (worker/db/store/page.py, migration 0031):
-- its audit trail of bulk actions. Each starts with a `-- name: <name>` line and
-- is run by one typed method.

-- name: start_page_action
insert into {schema}.page_actions (who, remote, action, filter, target, count_seen, matched,
                                   worker_id)
values ($1, $2, $3, $4, $5, $6, $7, $8)
returning action_id;

-- name: progress_page_action
update {schema}.page_actions
   set acted = $2, unchanged = $3, refused = $4, refusals = $5
 where action_id = $1;

-- name: finish_page_action
update {schema}.page_actions
   set acted = $2, unchanged = $3, refused = $4, refusals = $5, finished_at = now()
 where action_id = $1;

-- name: page_actions
-- The newest actions first.
select action_id, at, who, remote, action, filter, target, count_seen, matched, acted,
       unchanged, refused, refusals, finished_at, worker_id
  from {schema}.page_actions
 order by action_id desc
 limit $1;

-- name: timeline_releases
-- Every release the registry or the lanes know, newest first: its deploy record
-- (role, image, count, who, when), its lane (first registered, retired, pruned)
-- and the machines its live workers report.
select coalesce(d.release_id, l.release_ids[1], l.queue) as release_id,
       coalesce(d.queue, l.queue) as queue, d.role, d.image, d.desired, d.deployed_at,
       d.deployed_by, d.retired_at, d.retired_by, l.status as lane_status,
       l.created_at as registered_at, l.retired_at as lane_retired_at, l.pruned_at,
       coalesce((select array_agg(distinct w.machine_id order by w.machine_id)
                   from {schema}.workers w
                  where w.queue = coalesce(d.queue, l.queue) and w.machine_id is not null
                    and {schema}.worker_live(w.heartbeat_at, w.stopped_at)), '{}') as machines,
       -- The scaler's record that this deploy's machines fail to boot (0047).
       case when d.boot_failed_for = d.deployed_at then d.boot_failed end as boot_failed
  from {schema}.deployments d
  full join {schema}.releases l on l.queue = d.queue
 order by coalesce(d.deployed_at, l.created_at) desc
 limit $1;

-- name: timeline_events
-- The registry's events (deploys, rollbacks, retirements, machines), newest first.
select event_id, at, release_id, action, actor, detail
  from {schema}.deployment_events
 order by event_id desc
 limit $1;
