-- The app's SQL API (store migration 0008), as lane-worker itself calls it
-- (worker/db/store/api.py): `LaneClient` and the CLI go through these same
-- functions as an app in any other language, so each rule is written once.
-- Each starts with a `-- name: <name>` line and is run by one typed method.

-- name: submit_run
select {schema}.submit_run($1, $2, $3, $4, $5, $6);

-- name: submit_runs
-- Migration 0025: a JSON array of submits, one transaction, one result each.
select {schema}.submit_runs($1);

-- name: worker_release_id
-- Migration 0029: the release id (as deployed) and queue a worker with
-- suffix $1 / deploy version $2 serves.
select {schema}.worker_release_id($1, $2);

-- name: signal_run
select {schema}.signal_run($1, $2, $3);

-- name: cancel_run
select {schema}.cancel_run($1, $2);

-- name: run_status
-- In parts, each decoded alone: a stored value Python cannot decode (an
-- output 3,000 levels deep, written past the API's checks) then stands in as
-- that one value, never as the whole status (worker/db/store/api.py).
select s - 'output' - 'error' - 'facts' as rest, s -> 'output' as output,
       s -> 'error' as error,
       array(select f #- '{delivery,error}' from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as facts,
       array(select f #> '{delivery,error}' from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as delivery_errors
  from {schema}.run_status($1) s;

-- name: report_runner_result
select {schema}.report_runner_result($1, $2, $3);
