-- A `:continuations` loop's poll on another lane's queue as one static
-- statement (issue 30, "plans made once"), as own_claim.sql is the own loop's:
-- lane_worker.claim_next_v2 in mode 'adopt' (a claiming release on a retired
-- lane's queue) or 'drain' (a retired release where its adoptees lie), without
-- store facts or begun attempts (a continuation loop reads a run's facts as
-- late as it can), written out for the queue's own tables so the worker
-- prepares it once per connection and the server keeps its plan. After a week
-- of deploys every retired queue with open runs has one such loop per machine.
-- Its meaning is claim_next_v2's, statement for statement (claim_v1.sql's
-- claim_lane_v1, lane_filter_v1 and next_due_in_v1; tests/integration/
-- test_claim_continuations.py, test_claim_sets.py and test_claim_rule.py make
-- both claims and compare):
--   the claimer's lane row share-locked first (claim_v1.sql says why);
--   the mode as claim_mode_v1 serves it: 'drain' while the claimer's lane is
--   retired, whatever it asked, else the one asked ($7);
--   the cancellation upkeep, then the expired-lease sweep, each bounded by the
--   batch size, on lane-worker's tasks only (a store row, or a pending sandbox
--   cleanup): another system's tasks on this queue are left to their owner;
--   the pick: due pending and sleeping runs that the mode's filter lets
--   through, two ordered walks of the (state, available_at) index, rows
--   another session holds skipped, a task whose cancellation policy is due
--   never handed out. 'adopt': a run whose durable wait is over (sleeping, or
--   pending with an event payload) that the store's adoptable_by gives the
--   claimer, or a pending sandbox cleanup; 'drain': a run whose effective lane
--   is the claimer's, whose play its app registers, and that needs its lane
--   (the store's needs_own_lane);
--   the lease, the task marked, timed-out waits removed;
--   and, when it fell short of the batch and swept nothing, the seconds until
--   the next run this loop could claim is due.
-- One statement sees one snapshot. Where claim_next_v2 reads after its claim
-- (the next due time), the runs just claimed count by their new lease and the
-- tasks just cancelled not at all; after a sweep it gives no due time (the
-- sweep's retries are not in its snapshot), so the caller asks for it.
-- $1 queue (another lane's), $2 worker id (ending in :continuations), $3 lease
-- seconds, $4 batch size, $5 the claimer's own queue, $6 the app's plays,
-- $7 the mode asked ('adopt' or 'drain').

-- name: adopt_claim
with clock as materialized (
  select absurd.current_time() as now
), lane as materialized (
  select l.status from {schema}.releases l where l.queue = $5::text for share
), mode as materialized (
  select case when exists (select 1 from lane where status = 'retired') then 'drain'
              else $7::text end as m
), cancelled as materialized (
  select d.task_id, absurd.cancel_task($1::text, d.task_id)
    from (select t.task_id from {tasks} t
           where t.state in ('pending', 'sleeping', 'running')
             and coalesce((select true from {schema}.runs s where s.task_id = t.task_id),
                          (select true from {schema}.run_sandboxes x
                            where x.cleanup_task_id = t.task_id and x.cleanup = 'pending'
                            limit 1),
                          false)
             and t.cancellation is not null
             and ((t.cancellation->>'max_delay')::bigint is not null
                  and t.first_started_at is null
                  and extract(epoch from ((select now from clock) - t.enqueue_at))
                      >= (t.cancellation->>'max_delay')::bigint
               or (t.cancellation->>'max_duration')::bigint is not null
                  and t.first_started_at is not null
                  and extract(epoch from ((select now from clock) - t.first_started_at))
                      >= (t.cancellation->>'max_duration')::bigint)
           order by t.task_id
           limit $4::integer) d
), swept as materialized (
  select absurd.fail_run(
           $1::text, x.run_id,
           jsonb_strip_nulls(jsonb_build_object(
             'name', '$ClaimTimeout',
             'message', 'lease expired before the worker finished (swept by lane_worker.claim_lane_v1)',
             'workerId', x.claimed_by,
             'claimExpiredAt', x.claim_expires_at,
             'attempt', x.attempt)),
           null)
    from (select r.run_id, r.claimed_by, r.claim_expires_at, r.attempt
            from {runs} r
            join {tasks} t on t.task_id = r.task_id
           -- After the upkeep, as claim_lane_v1 orders them: a run whose task it
           -- just cancelled is then no lease to sweep (its row, written after this
           -- statement's snapshot, is skipped by the lock).
           where (select count(*) from cancelled) >= 0
             and r.state = 'running' and r.claim_expires_at is not null
             and r.claim_expires_at <= (select now from clock)
             and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                          (select true from {schema}.run_sandboxes x
                            where x.cleanup_task_id = r.task_id and x.cleanup = 'pending'
                            limit 1),
                          false)
           order by r.claim_expires_at, r.run_id
           limit $4::integer
           for update of r, t skip locked) x
), pending_due as materialized (
  select r.run_id, r.available_at
    from {runs} r
    join {tasks} t on t.task_id = r.task_id
   where r.state = 'pending'
     and r.available_at <= (select now from clock)
     and t.state in ('pending', 'sleeping', 'running')
     and not (t.cancellation is not null
              and ((t.cancellation->>'max_delay')::bigint is not null
                   and t.first_started_at is null
                   and extract(epoch from ((select now from clock) - t.enqueue_at))
                       >= (t.cancellation->>'max_delay')::bigint
                or (t.cancellation->>'max_duration')::bigint is not null
                   and t.first_started_at is not null
                   and extract(epoch from ((select now from clock) - t.first_started_at))
                       >= (t.cancellation->>'max_duration')::bigint))
     -- the mode's filter (claim_v1.sql lane_filter_v1, 'adopt' and 'drain' on
     -- another lane's queue)
     and ((select m from mode) = 'adopt'
          and (((r.state = 'sleeping' or (r.state = 'pending' and r.event_payload is not null))
                and exists (select 1 from {schema}.runs s
                             where s.task_id = r.task_id
                               and {schema}.adoptable_by(s.status, s.play, s.adopted_queue,
                                                         $1::text, $5::text, $6::text[])))
               -- a retired lane's pending sandbox cleanup needs no play code
               or (r.state in ('pending', 'sleeping')
                   and exists (select 1 from {schema}.run_sandboxes x
                                where x.cleanup_task_id = r.task_id
                                  and x.cleanup = 'pending')))
       or (select m from mode) = 'drain'
          and r.state in ('pending', 'sleeping')
          and exists (select 1 from {schema}.runs s
                       where s.task_id = r.task_id
                         and coalesce(s.adopted_queue, $1::text) = $5::text
                         and s.play = any ($6::text[])
                         and {schema}.needs_own_lane(s.status, s.play, $5::text, s.queue)))
   order by r.available_at, r.run_id
   limit $4::integer
   for update of r, t skip locked
), sleeping_due as materialized (
  select r.run_id, r.available_at
    from {runs} r
    join {tasks} t on t.task_id = r.task_id
   where r.state = 'sleeping'
     and r.available_at <= (select now from clock)
     and t.state in ('pending', 'sleeping', 'running')
     and not (t.cancellation is not null
              and ((t.cancellation->>'max_delay')::bigint is not null
                   and t.first_started_at is null
                   and extract(epoch from ((select now from clock) - t.enqueue_at))
                       >= (t.cancellation->>'max_delay')::bigint
                or (t.cancellation->>'max_duration')::bigint is not null
                   and t.first_started_at is not null
                   and extract(epoch from ((select now from clock) - t.first_started_at))
                       >= (t.cancellation->>'max_duration')::bigint))
     and ((select m from mode) = 'adopt'
          and (((r.state = 'sleeping' or (r.state = 'pending' and r.event_payload is not null))
                and exists (select 1 from {schema}.runs s
                             where s.task_id = r.task_id
                               and {schema}.adoptable_by(s.status, s.play, s.adopted_queue,
                                                         $1::text, $5::text, $6::text[])))
               or (r.state in ('pending', 'sleeping')
                   and exists (select 1 from {schema}.run_sandboxes x
                                where x.cleanup_task_id = r.task_id
                                  and x.cleanup = 'pending')))
       or (select m from mode) = 'drain'
          and r.state in ('pending', 'sleeping')
          and exists (select 1 from {schema}.runs s
                       where s.task_id = r.task_id
                         and coalesce(s.adopted_queue, $1::text) = $5::text
                         and s.play = any ($6::text[])
                         and {schema}.needs_own_lane(s.status, s.play, $5::text, s.queue)))
   order by r.available_at, r.run_id
   limit $4::integer
   for update of r, t skip locked
), picked as materialized (
  select d.run_id
    from (select * from pending_due union all select * from sleeping_due) d
   order by d.available_at, d.run_id
   limit $4::integer
), leased as materialized (
  update {runs} r
     set state = 'running', claimed_by = $2::text,
         claim_expires_at = case when $3::integer > 0
                                 then (select now from clock) + make_interval(secs => $3::integer)
                            end,
         started_at = (select now from clock), available_at = (select now from clock)
    from picked p
   where r.run_id = p.run_id
  returning r.run_id, r.task_id, r.attempt, r.wake_event, r.event_payload, r.claim_expires_at
), task_marked as materialized (
  update {tasks} t
     set state = 'running',
         attempts = greatest(t.attempts, l.attempt),
         first_started_at = coalesce(t.first_started_at, (select now from clock)),
         last_attempt_run = l.run_id
    from leased l
   where t.task_id = l.task_id
  returning t.task_id, t.task_name, t.params, t.max_attempts
), timed_out_waits as materialized (
  delete from {waits} w
   using leased l
   where w.run_id = l.run_id and w.timeout_at is not null
     and w.timeout_at <= (select now from clock)
  returning w.run_id
), tally as materialized (
  -- the upkeep first: the sweep waits for it (above)
  select (select count(*) from cancelled)::integer as cancelled,
         (select count(*) from swept)::integer as swept,
         (select count(*) from leased)::integer as claimed,
         (select count(*) from timed_out_waits)::integer as waits
)
(select l.run_id, l.task_id, l.attempt, tm.task_name, tm.params, tm.max_attempts,
        l.wake_event, l.event_payload, (select swept from tally) as swept,
        false as due_known, null::float8 as due_in_s
   from leased l
   join task_marked tm on tm.task_id = l.task_id
  order by l.run_id)
union all
-- Nothing handed out but leases swept: the caller's reconciler settles them.
select null, null, null, null, null, null, null, null, t.swept, false, null
  from tally t where t.claimed = 0 and t.swept > 0
union all
-- Short of the batch, nothing swept: when the next run this loop could claim
-- is due (next_due_in_v1: the mode's filter on pending and sleeping runs, any
-- of lane-worker's leases), the runs just claimed by their lease's end.
select null, null, null, null, null, null, null, null, 0, true,
       extract(epoch from (
         select min(d.due)
           from ((select r.available_at as due from {runs} r
                   where r.state = 'pending' and r.available_at < 'infinity'
                     and r.run_id not in (select p.run_id from picked p)
                     and r.task_id not in (select c.task_id from cancelled c)
                     and ((select m from mode) = 'adopt'
                          and (((r.state = 'sleeping'
                                 or (r.state = 'pending' and r.event_payload is not null))
                                and exists (select 1 from {schema}.runs s
                                             where s.task_id = r.task_id
                                               and {schema}.adoptable_by(
                                                     s.status, s.play, s.adopted_queue,
                                                     $1::text, $5::text, $6::text[])))
                               or (r.state in ('pending', 'sleeping')
                                   and exists (select 1 from {schema}.run_sandboxes x
                                                where x.cleanup_task_id = r.task_id
                                                  and x.cleanup = 'pending')))
                       or (select m from mode) = 'drain'
                          and r.state in ('pending', 'sleeping')
                          and exists (select 1 from {schema}.runs s
                                       where s.task_id = r.task_id
                                         and coalesce(s.adopted_queue, $1::text) = $5::text
                                         and s.play = any ($6::text[])
                                         and {schema}.needs_own_lane(s.status, s.play, $5::text,
                                                                     s.queue)))
                   order by r.available_at limit 1)
                 union all
                 (select r.available_at from {runs} r
                   where r.state = 'sleeping' and r.available_at < 'infinity'
                     and r.run_id not in (select p.run_id from picked p)
                     and r.task_id not in (select c.task_id from cancelled c)
                     and ((select m from mode) = 'adopt'
                          and (((r.state = 'sleeping'
                                 or (r.state = 'pending' and r.event_payload is not null))
                                and exists (select 1 from {schema}.runs s
                                             where s.task_id = r.task_id
                                               and {schema}.adoptable_by(
                                                     s.status, s.play, s.adopted_queue,
                                                     $1::text, $5::text, $6::text[])))
                               or (r.state in ('pending', 'sleeping')
                                   and exists (select 1 from {schema}.run_sandboxes x
                                                where x.cleanup_task_id = r.task_id
                                                  and x.cleanup = 'pending')))
                       or (select m from mode) = 'drain'
                          and r.state in ('pending', 'sleeping')
                          and exists (select 1 from {schema}.runs s
                                       where s.task_id = r.task_id
                                         and coalesce(s.adopted_queue, $1::text) = $5::text
                                         and s.play = any ($6::text[])
                                         and {schema}.needs_own_lane(s.status, s.play, $5::text,
                                                                     s.queue)))
                   order by r.available_at limit 1)
                 union all
                 (select min(r.claim_expires_at) from {runs} r
                   where r.state = 'running' and r.claim_expires_at is not null
                     and r.task_id not in (select c.task_id from cancelled c)
                     and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                                  (select true from {schema}.run_sandboxes x
                                    where x.cleanup_task_id = r.task_id
                                      and x.cleanup = 'pending' limit 1),
                                  false))
                 union all
                 (select min(l.claim_expires_at) from leased l)) d
       ) - absurd.current_time())::float8
  from tally t
 where t.swept = 0 and t.claimed < $4::integer;