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
-- $3: who cancels, the fact's source (client: the app; operator: the CLI, the page).
select {schema}.cancel_run_by($1, $2, $3);

-- name: run_status
-- In parts, each decoded alone: a stored value Python cannot decode (an
-- output 3,000 levels deep, written past the API's checks) then stands in as
-- that one value, never as the whole status (worker/db/store/api.py).
select s - 'output' - 'error' - 'facts' as rest, s -> 'output' as output,
       -- What a parked run waits for, as short text fields only (its kind, an event's
       -- key, a sleep's end or a deadline): `status` says it, `signal` checks the key.
       (select jsonb_build_object('kind', r.current_wait ->> 'kind',
                                  'eventKey', r.current_wait ->> 'eventKey',
                                  'wakeAtMs', r.current_wait ->> 'wakeAtMs',
                                  'deadlineMs', r.current_wait ->> 'deadlineMs')
          from {schema}.runs r
         where r.run_id = $1 and r.status = 'waiting'
           and jsonb_typeof(r.current_wait) = 'object') as wait,
       s -> 'error' as error,
       array(select f #- '{delivery,error}' from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as facts,
       array(select f #> '{delivery,error}' from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as delivery_errors,
       -- What `status` shows beside the function's object (issue 31; the
       -- function is unchanged): each claim's stored error (a put-back's reason),
       -- times and machine, in the function's order of attempts ...
       array(select a.error from {schema}.attempts a
              where a.run_id = $1 order by a.attempt_id) as attempt_errors,
       array(select jsonb_build_object('claimedAt', a.claimed_at, 'finishedAt', a.finished_at,
                                       'machineId', w.machine_id)
               from {schema}.attempts a
               left join lateral (
                 select w.machine_id from {schema}.workers w
                  where w.worker_id in (a.worker_id, regexp_replace(
                          a.worker_id, ':[^:]*:continuations$', ''))
                  limit 1) w on true
              where a.run_id = $1 order by a.attempt_id) as claims,
       -- ... and the durable sleeps it finished, which its envelope keeps (an
       -- event's wait is an engine checkpoint, among the steps), with the
       -- attempt that was running when each ended, as the steps have.
       array(select jsonb_build_object('name', 'sleep:' || b.key,
                                       -- as deployed, as run_status names releases (0030)
                                       'releaseId', {schema}.release_as_deployed(a.release_id),
                                       'attempt', a.attempt, 'workerId', a.worker_id,
                                       'committedAt', b.at)
               from (select b.key,
                            case when jsonb_typeof(b.value -> 'completedAt') = 'number'
                                  and (b.value ->> 'completedAt')::numeric between 0 and 1e14
                                 then to_timestamp((b.value ->> 'completedAt')::numeric / 1000)
                            end as at
                       from {schema}.runs r,
                            jsonb_each(case jsonb_typeof(r.checkpoint -> 'resolvedBoundaries')
                                       when 'object' then r.checkpoint -> 'resolvedBoundaries'
                                       else '{}' end) b
                      where r.run_id = $1 and jsonb_typeof(b.value) = 'object'
                        and b.value ->> 'kind' = 'sleep') b
               left join lateral (
                 select a.attempt, a.release_id, a.worker_id
                   from {schema}.attempts a
                  where a.run_id = $1 and a.disposition in ('own', 'adopt')
                    and a.claimed_at <= b.at
                  order by a.claimed_at desc, a.attempt_id desc
                  limit 1) a on true
              where b.at is not null order by b.at, b.key) as sleeps
  from {schema}.run_status($1) s;

-- name: report_runner_result
select {schema}.report_runner_result($1, $2, $3);

-- name: run_status_api
-- run_status alone, in the same parts as run_status above: for a role that may
-- call the SQL API and read no table (the app's, issue 33). Its claims then
-- carry no times, machine or error, and the durable sleeps are not among the
-- steps (the tables hold those).
select s - 'output' - 'error' - 'facts' as rest, s -> 'output' as output,
       s -> 'error' as error,
       array(select f #- '{delivery,error}' from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as facts,
       array(select f #> '{delivery,error}' from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as delivery_errors
  from {schema}.run_status($1) s;

-- name: cancel_run_api
-- The SQL API's cancel_run: cancel_run_by($1, $2, 'client') with the owner's
-- rights (0041), for a role granted the API only.
select {schema}.cancel_run($1, $2);

-- name: schema_versions
-- The store's applied migrations, the engine's version and contracts (0043).
select {schema}.schema_versions();

-- name: run_status_bookkeeping
-- For a role that may call neither run_status nor read the payloads (the viewer,
-- the scaler: issue 33): run_status less its output, error and delivery errors
-- (store 0049), in the same parts; output and error are null.
select s - 'facts' as rest, null::jsonb as output, null::jsonb as error,
       array(select f from jsonb_array_elements(s -> 'facts')
                      with ordinality as e(f, n) order by n) as facts,
       array(select null::jsonb from jsonb_array_elements(s -> 'facts')) as delivery_errors
  from {schema}.run_status_bookkeeping_v1($1) s;
