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
