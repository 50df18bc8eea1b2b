-- The own loop's poll on one queue as one static statement (issue 30, "plans
-- made once"): lane_worker.claim_next_v2 with no mode and begun attempts,
-- written out for the queue's own tables. claim_next_v2 builds the same
-- statements with format() on every call, and PostgreSQL plans each on every
-- call (about 1.2 ms a claim); this text names its tables, so the worker
-- prepares it once per connection and the server keeps its plan. Its meaning
-- is claim_next_v2's, statement for statement (tests/integration/
-- test_claim_sets.py makes both claims over one history and compares, and
-- test_claim_all.py drains with it against absurd.claim_task):
--   the claimer's lane row share-locked first (claim_v1.sql says why);
--   a retired lane claims nothing here (retired: true): its worker then claims
--   with claim_next_v2, which serves it as 'drain';
--   the cancellation upkeep and the expired-lease sweep, each bounded by the
--   batch size, on lane-worker's tasks only (a store row, or a pending sandbox
--   cleanup);
--   the pick (mode 'all'): due pending and sleeping runs of lane-worker's, two
--   ordered walks of the (state, available_at) index, rows another session
--   holds skipped, a task whose cancellation policy is due never handed out;
--   the lease, the task marked, timed-out waits removed;
--   each run's store facts, and the attempts of those the own loop will
--   certainly own begun (begin_attempts, store migration 0028), store rows
--   another session holds skipped;
--   and, when it fell short of the batch and swept nothing, the seconds until
--   the next run is due.
-- One statement sees one snapshot: a run is handed out with the store row its
-- submit wrote in the same transaction. Where claim_next_v2 reads after its
-- claim (the next due time), the runs just claimed count by their new lease.
-- $1 queue (the claimer's own), $2 worker id, $3 lease seconds, $4 batch size,
-- $5 the app's plays, $6 the claimer's release id, $7 the attempts' worker id,
-- $8 the step-key mapping.

-- name: own_claim
with clock as materialized (
  select absurd.current_time() as now
), lane as materialized (
  select l.status from {schema}.releases l where l.queue = $1 for share
), retired as materialized (
  select exists (select 1 from lane where status = 'retired') as yes
), cancelled as materialized (
  select absurd.cancel_task($1, d.task_id)
    from (select t.task_id from {tasks} t
           where not (select yes from retired)
             and t.state in ('pending', 'sleeping', 'running')
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
           limit $4) d
), swept as materialized (
  select absurd.fail_run(
           $1, x.run_id,
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
           -- After the upkeep, as the engine's claim orders them: a run whose task
           -- it just cancelled is no lease to sweep (its row, written after this
           -- statement's snapshot, is skipped by the lock).
           where (select count(*) from cancelled) >= 0
             and not (select yes from retired)
             and r.state = 'running' and r.claim_expires_at is not null
             and r.claim_expires_at <= (select now from clock)
             and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                          (select true from {schema}.run_sandboxes x
                            where x.cleanup_task_id = r.task_id and x.cleanup = 'pending'
                            limit 1),
                          false)
           order by r.claim_expires_at, r.run_id
           limit $4
           for update of r, t skip locked) x
), pending_due as materialized (
  select r.run_id, r.available_at
    from {runs} r
    join {tasks} t on t.task_id = r.task_id
   where not (select yes from retired)
     and r.state = 'pending'
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
     and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                  (select true from {schema}.run_sandboxes x
                    where x.cleanup_task_id = r.task_id and x.cleanup = 'pending'
                    limit 1),
                  false)
   order by r.available_at, r.run_id
   limit $4
   for update of r, t skip locked
), sleeping_due as materialized (
  select r.run_id, r.available_at
    from {runs} r
    join {tasks} t on t.task_id = r.task_id
   where not (select yes from retired)
     and r.state = 'sleeping'
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
     and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                  (select true from {schema}.run_sandboxes x
                    where x.cleanup_task_id = r.task_id and x.cleanup = 'pending'
                    limit 1),
                  false)
   order by r.available_at, r.run_id
   limit $4
   for update of r, t skip locked
), picked as materialized (
  select d.run_id
    from (select * from pending_due union all select * from sleeping_due) d
   order by d.available_at, d.run_id
   limit $4
), leased as materialized (
  update {runs} r
     set state = 'running', claimed_by = $2,
         claim_expires_at = case when $3 > 0
                                 then (select now from clock) + make_interval(secs => $3) end,
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
), facts as materialized (
  select l.run_id as engine_run_id, l.task_id, l.attempt, s.run_id, s.release_id,
         s.adopted_release_id, s.adopted_queue, s.status, s.current_wait, s.play, s.input,
         s.current_attempt_id is null as fresh,
         coalesce(lr.status = 'claiming', false) as lane_claiming,
         coalesce(ar.status = 'claiming', false) as adopter_claiming,
         -- The lane guard: the run's release and the claimer's share a lane.
         case when coalesce(s.release_id, '') = '' then false
              when s.release_id = $6 then true
              else {schema}.queue_for_release(s.release_id) = $1 end as on_own_lane
    from leased l
    left join {schema}.runs s on s.task_id = l.task_id
    left join {schema}.releases lr on lr.queue = s.queue
    left join {schema}.releases ar on ar.queue = s.adopted_queue
), own as materialized (
  select f.* from facts f
   where f.run_id is not null and f.on_own_lane
     and (f.adopted_release_id is null or f.adopted_queue = $1)
     and f.play = any($5)
), locked as materialized (
  select s.run_id from {schema}.runs s
   where s.run_id in (select o.run_id from own o)
   order by s.run_id
     for update skip locked
), attempt as materialized (
  insert into {schema}.attempts
         (run_id, engine_run_id, attempt, worker_id, release_id, disposition)
  select o.run_id, o.engine_run_id, o.attempt, $7, $6, 'own'
    from own o where o.run_id in (select k.run_id from locked k)
  returning attempt_id, run_id, engine_run_id
), taken as materialized (
  update {schema}.runs r
     set status = 'running',
         current_attempt_id = a.attempt_id,
         current_wait = null,
         attempts = greatest(r.attempts, o.attempt),
         step_keys = case when r.current_attempt_id is null then $8::smallint
                          else r.step_keys end,
         defer_count = 0, first_deferred_at = null, defer_alerted_at = null,
         updated_at = now()
    from attempt a join own o on o.engine_run_id = a.engine_run_id
   where r.run_id = a.run_id
     and r.status not in ('completed', 'failed', 'cancelled')
     -- `lanes move` gave the run a new engine task: a claim of the old one is stale.
     and r.task_id = o.task_id
  returning r.run_id, a.engine_run_id, r.checkpoint, r.step_keys
), superseded as materialized (
  update {schema}.attempts o
     set outcome = 'lease_lost', finished_at = now(),
         error = coalesce(o.error, jsonb_build_object(
           'reason', 'a newer attempt took the run over'))
    from taken t
   where o.run_id = t.run_id and o.outcome is null
  returning o.attempt_id
), started as materialized (
  insert into {schema}.ledger (run_id, type, fact)
  select t.run_id, 'run.started',
         jsonb_build_object('type', 'run.started', 'runId', t.run_id::text,
                            'occurredAt', (extract(epoch from now()) * 1000)::bigint,
                            'source', 'worker', 'releaseId', $6::text,
                            'attempt', o.attempt::integer)
    from taken t join own o on o.engine_run_id = t.engine_run_id
   where exists (select 1 from {schema}.run_runtime_api x where x.run_id = t.run_id)
  on conflict (run_id) where type = 'run.started' do nothing
  returning run_id
), tally as materialized (
  select (select count(*) from leased)::integer as claimed,
         (select count(*) from swept)::integer as swept,
         (select count(*) from cancelled) + (select count(*) from timed_out_waits)
           + (select count(*) from superseded) + (select count(*) from started) as writes
)
(select l.run_id, l.task_id, l.attempt, tm.task_name, tm.params, tm.max_attempts,
       l.wake_event, l.event_payload, (select swept from tally) as swept,
       f.run_id as lane_run_id, f.release_id as lane_release_id,
       f.adopted_release_id as lane_adopted_release_id,
       f.adopted_queue as lane_adopted_queue, f.status as lane_status,
       f.current_wait as lane_current_wait, f.play as lane_play, f.input as lane_input,
       f.lane_claiming as lane_lane_claiming, f.adopter_claiming as lane_adopter_claiming,
       a.attempt_id as begun_attempt_id, tk.checkpoint as begun_checkpoint,
       tk.step_keys as begun_step_keys,
       case when tk.checkpoint is not null then f.current_wait end as begun_current_wait,
       case when tk.checkpoint is null then null
            when f.fresh then '{}'::jsonb  -- no attempt took it over: no checkpoint
            else (select coalesce(jsonb_object_agg(c.checkpoint_name, c.state), '{}'::jsonb)
                    from absurd.get_task_checkpoint_states($1, l.task_id, l.run_id) c)
       end as begun_engine_checkpoints,
       case when a.attempt_id is not null
            then (extract(epoch from (select now from clock)) * 1000)::bigint
       end as begun_db_now_ms,
       false as due_known, null::float8 as due_in_s, false as retired
  from leased l
  join task_marked tm on tm.task_id = l.task_id
  left join facts f on f.engine_run_id = l.run_id
  left join attempt a on a.engine_run_id = l.run_id
  left join taken tk on tk.engine_run_id = l.run_id
 order by l.run_id)
union all
-- Nothing handed out but leases swept: the caller's reconciler settles them.
select null, null, null, null, null, null, null, null, t.swept,
       null, null, null, null, null, null, null, null, null, null,
       null, null, null, null, null, null, false, null, false
  from tally t where t.claimed = 0 and t.swept > 0
union all
-- Short of the batch, nothing swept: when the next run is due (the runs just
-- claimed by their lease's end); a sweep's retries are due after this
-- snapshot, so then the caller asks for the due time itself.
select null, null, null, null, null, null, null, null, 0,
       null, null, null, null, null, null, null, null, null, null,
       null, null, null, null, null, null, true,
       extract(epoch from (
         select min(d.due)
           from ((select r.available_at as due from {runs} r
                   where r.state = 'pending' and r.available_at < 'infinity'
                     and r.run_id not in (select p.run_id from picked p)
                     and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                                  (select true from {schema}.run_sandboxes x
                                    where x.cleanup_task_id = r.task_id
                                      and x.cleanup = 'pending' limit 1),
                                  false)
                   order by r.available_at limit 1)
                 union all
                 (select r.available_at from {runs} r
                   where r.state = 'sleeping' and r.available_at < 'infinity'
                     and r.run_id not in (select p.run_id from picked p)
                     and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                                  (select true from {schema}.run_sandboxes x
                                    where x.cleanup_task_id = r.task_id
                                      and x.cleanup = 'pending' limit 1),
                                  false)
                   order by r.available_at limit 1)
                 union all
                 (select min(r.claim_expires_at) from {runs} r
                   where r.state = 'running' and r.claim_expires_at is not null
                     and coalesce((select true from {schema}.runs s where s.task_id = r.task_id),
                                  (select true from {schema}.run_sandboxes x
                                    where x.cleanup_task_id = r.task_id
                                      and x.cleanup = 'pending' limit 1),
                                  false))
                 union all
                 (select min(l.claim_expires_at) from leased l)) d
       ) - absurd.current_time())::float8,
       false
  from tally t
 where not (select yes from retired) and t.swept = 0 and t.claimed < $4
union all
-- A retired lane: nothing claimed here; its worker claims with claim_next_v2.
select null, null, null, null, null, null, null, null, 0,
       null, null, null, null, null, null, null, null, null, null,
       null, null, null, null, null, null, false, null, true
 where (select yes from retired);
