-- Run-state store queries. Each starts with a `-- name: <name>` line and is
-- run by one typed method of worker/db/store. `{schema}` is the store schema
-- and `{checkpoints}` a queue's engine checkpoint table, quoted when the text is
-- filled in (worker/db/sql.py). Values are always bound parameters.

-- name: insert_run
insert into {schema}.runs (run_id, play, input, launch, release_id, queue, idempotency_key,
                          max_attempts, retry_of)
values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
on conflict (idempotency_key) do nothing
returning run_id;

-- name: run_by_idempotency_key
-- same_input compares as jsonb does ($2: the new request's input): 1.0 equals 1,
-- true does not.
select run_id, release_id, queue, play, input = $2::jsonb as same_input
  from {schema}.runs where idempotency_key = $1;

-- name: set_run_task
update {schema}.runs set task_id = $2, updated_at = now() where run_id = $1;

-- name: get_run
select * from {schema}.runs where run_id = $1;

-- name: lock_run
select * from {schema}.runs where run_id = $1 for update;

-- name: lock_run_shared
-- A signal or a status-changing read: waits for a `lanes move`, a `runs retry`
-- or a `runs fail` of the run in progress, and sees what it committed.
select * from {schema}.runs where run_id = $1 for share;

-- name: mark_retried
update {schema}.runs set retried_by = $2, updated_at = now() where run_id = $1;

-- name: copy_signals
-- The events run $1 received, for its retry $2: its plays wait for them again.
insert into {schema}.signals (run_id, event_key, payload, received_at)
select $2, s.event_key, s.payload, s.received_at
  from {schema}.signals s
 where s.run_id = $1
on conflict (run_id, event_key) do nothing;

-- name: list_runs
-- Newest first; each filter applies when given (a lane matches its own runs
-- and the runs it adopted).
select run_id, play, status, release_id, queue, adopted_release_id, attempts, created_at,
       retry_of
  from {schema}.runs
 where ($1::text is null or status = $1)
   and ($2::text is null or queue = $2 or adopted_queue = $2)
   and ($3::text is null or play = $3)
 order by created_at desc, run_id
 limit $4;

-- name: claiming_lanes_for_play
-- Claiming lanes, newest first, with a live worker whose app registers play $1:
-- where a retry of that play can run.
select l.queue, coalesce(l.release_ids[1], l.queue) as release_id
  from {schema}.releases l
 where l.status = 'claiming'
   and exists (select 1 from {schema}.workers w
                where w.queue = l.queue and {schema}.worker_live(w.heartbeat_at, w.stopped_at)
                  and $1 = any (w.plays))
 order by l.created_at desc, l.queue desc;

-- name: attempt_on_live_worker
-- Whether an attempt of run $1 began executing, has not recorded its end, and
-- belongs to a worker whose heartbeat is live (a continuation loop's worker id
-- is its process's id plus ':<queue>:continuations').
select exists (
  select 1
    from {schema}.attempts a
   where a.run_id = $1 and a.outcome is null and a.disposition in ('own', 'adopt')
     and {schema}.attempt_worker_live(a.worker_id)
);

-- name: close_abandoned_attempts
-- Attempts that recorded no end, whose run moved on without them (a newer
-- attempt took it over, or it ended) and whose worker is gone (killed): closed
-- as a lost lease, at most $1 per call. begin_attempt and settle_run close most
-- of them at once; this catches a worker that died after its run ended.
with gone as (
  select a.attempt_id
    from {schema}.attempts a
    join {schema}.runs r on r.run_id = a.run_id
   where a.outcome is null
     and (r.status in ('completed', 'failed', 'cancelled')
          or r.current_attempt_id is distinct from a.attempt_id)
     and not {schema}.attempt_worker_live(a.worker_id)
   limit $1
)
update {schema}.attempts a
   set outcome = 'lease_lost', finished_at = now(),
       error = coalesce(a.error, jsonb_build_object(
         'reason', 'its worker stopped without recording its end'))
  from gone g
 where a.attempt_id = g.attempt_id and a.outcome is null
returning a.attempt_id;

-- name: live_plays
-- The plays the live workers of lane $1 register.
select coalesce(array_agg(distinct p), '{}') as plays
  from {schema}.workers w cross join lateral unnest(w.plays) as p
 where w.queue = $1 and {schema}.worker_live(w.heartbeat_at, w.stopped_at);

-- name: lane_play_registered
-- Whether a live worker of lane $1 registers play $2, and whether any worker of
-- it ever did.
select coalesce(bool_or({schema}.worker_live(w.heartbeat_at, w.stopped_at)), false) as live,
       count(*) > 0 as ever
  from {schema}.workers w
 where w.queue = $1 and $2 = any (w.plays);

-- name: lane_row
select queue, status, release_ids from {schema}.releases where queue = $1;

-- name: lane_open_runs
-- Open runs whose effective lane is $1 (what `lanes move` considers), oldest first.
select run_id from {schema}.runs
 where coalesce(adopted_queue, queue) = $1
   and status not in ('completed', 'failed', 'cancelled')
 order by created_at, run_id;

-- name: move_run
update {schema}.runs
   set queue = $2, release_id = $3,
       launch = launch || jsonb_build_object('absurdReleaseId', $3::text),
       updated_at = now()
 where run_id = $1;

-- name: step_provenance
-- Which attempt (and so which release) committed each of a task's checkpoints:
-- the own/adopt attempt on the checkpoint's engine run that began last before
-- the write (a run handed back mid-step keeps its engine run).
select c.checkpoint_name, c.updated_at, a.attempt, a.release_id, a.worker_id
  from {checkpoints} c
  left join lateral (
    select a.attempt, a.release_id, a.worker_id
      from {schema}.attempts a
     where a.run_id = $2 and a.engine_run_id = c.owner_run_id
       and a.disposition in ('own', 'adopt') and a.claimed_at <= c.updated_at
     order by a.claimed_at desc, a.attempt_id desc
     limit 1) a on true
 where c.task_id = $1
 order by c.updated_at, c.checkpoint_name;

-- name: run_attempts
select a.attempt, a.worker_id, a.release_id, a.disposition, a.outcome, a.error,
       a.claimed_at, a.finished_at
  from {schema}.attempts a
 where a.run_id = $1
 order by a.attempt_id;

-- name: begin_attempt
-- Own and adopt take the run over (status running, fence moves to this
-- attempt, the wait it was parked in is over); defer and refuse only record
-- that the claim happened. Returns the envelope and the wait as of the fence
-- move (an older attempt may still write them until then, never after), the
-- run's step-key mapping (stamped by its first execution: $9), and the
-- database's clock, which every duration of the attempt is measured on.
with prev as (
  -- The statement's snapshot: only a park or a settle changes the wait, and
  -- neither can commit for a run whose engine run this claim now holds.
  select r.current_wait from {schema}.runs r where r.run_id = $1
), attempt as (
  insert into {schema}.attempts (run_id, engine_run_id, attempt, worker_id, release_id, disposition)
  values ($1, $2, $3, $4, $5, $6)
  returning attempt_id
), taken as (
  update {schema}.runs r
     set status = 'running',
         current_attempt_id = (select attempt_id from attempt),
         current_wait = null,
         attempts = greatest(r.attempts, $3),
         adopted_release_id = case when $6 = 'adopt' then $7 else r.adopted_release_id end,
         adopted_queue = case when $6 = 'adopt' then $8 else r.adopted_queue end,
         step_keys = case when r.current_attempt_id is null then $9::smallint else r.step_keys end,
         -- Taken over: whatever deferral streak it had is over.
         defer_count = 0, first_deferred_at = null, defer_alerted_at = null,
         updated_at = now()
   where r.run_id = $1
     and $6 in ('own', 'adopt')
     and r.status not in ('completed', 'failed', 'cancelled')
     -- `lanes move` gave the run a new engine task: a claim of the old one is stale.
     and r.task_id = $10
  returning r.checkpoint, r.step_keys
), superseded as (
  -- Taken over: every older claim of the run that recorded no end (its worker
  -- was killed, or lost its lease) has lost it, in this same statement.
  update {schema}.attempts o
     set outcome = 'lease_lost', finished_at = now(),
         error = coalesce(o.error, jsonb_build_object(
           'reason', 'a newer attempt took the run over'))
    from taken t
   where o.run_id = $1 and o.outcome is null
)
select a.attempt_id, t.checkpoint, t.step_keys,
       case when t.checkpoint is not null then (select current_wait from prev) end as current_wait,
       (extract(epoch from absurd.current_time()) * 1000)::bigint as db_now_ms
  from attempt a left join taken t on true;

-- name: finish_attempt
update {schema}.attempts
   set outcome = $2, error = $3, finished_at = now()
 where attempt_id = $1 and outcome is null;

-- name: save_checkpoint
-- Fenced: only the run's current attempt may write.
update {schema}.runs
   set checkpoint = $3, updated_at = now()
 where run_id = $1 and current_attempt_id = $2
returning run_id;

-- name: park_run
update {schema}.runs
   set status = 'waiting', current_wait = $3, checkpoint = $4, updated_at = now()
 where run_id = $1 and current_attempt_id = $2
returning run_id;

-- name: count_deferral
-- One more deferral in the run's current streak; alert_now is true for the one
-- deferral that finds the streak older than $2 seconds (warned about once).
update {schema}.runs r
   set defer_count = r.defer_count + 1,
       first_deferred_at = coalesce(r.first_deferred_at, now()),
       defer_alerted_at = case
         when r.defer_alerted_at is null and r.first_deferred_at is not null
              and now() - r.first_deferred_at >= make_interval(secs => $2) then now()
         else r.defer_alerted_at end
 where r.run_id = $1
returning r.defer_count,
          extract(epoch from now() - r.first_deferred_at)::float8 as deferred_s,
          coalesce(r.defer_alerted_at = now(), false) as alert_now;

-- name: hand_back_claim
-- A claim given back (shutdown, or an error before the claim ended): end this
-- worker's open attempts on this engine run ($4: 'handed_back', or 'lease_lost'
-- when the engine run is no longer held) and return the run to its lane. The
-- attempt row is the fence: a claim whose attempt already ended (park,
-- completion, failure, put-back) is not touched.
with closed as (
  update {schema}.attempts a
     set outcome = $4, finished_at = now()
    from {schema}.runs r
   where r.task_id = $1
     and a.run_id = r.run_id
     and a.engine_run_id = $2
     and a.worker_id = $3
     and a.outcome is null
  returning a.attempt_id, a.run_id
), released as (
  update {schema}.runs r
     set status = case when r.current_wait is not null then 'waiting' else 'queued' end,
         updated_at = now()
    from closed c
   where r.run_id = c.run_id and r.current_attempt_id = c.attempt_id and r.status = 'running'
  returning r.run_id
)
select c.attempt_id, c.run_id, (select count(*) from released) as released from closed c;

-- name: lock_running_attempt
-- Fenced, and only while the attempt still runs the play: once it parked (a
-- sleep in a task group, say), failing it would spend an attempt on a run
-- that is safely waiting.
select run_id from {schema}.runs
 where run_id = $1 and current_attempt_id = $2 and status = 'running'
   for update;

-- name: retrying_run
update {schema}.runs
   set status = 'retrying', error = $3, updated_at = now()
 where run_id = $1 and current_attempt_id = $2
returning run_id;

-- name: settle_run
-- Terminal state for a run, fenced by attempt unless $2 is null (reconciler,
-- cancel), and never over another terminal state; the terminal fact ($6, $7)
-- is appended in the same statement, only when the run was settled here. $8:
-- an unfenced caller's own attempt (a deferral's put-back), which it ends.
with settled as (
  update {schema}.runs
     set status = $3, output = $4, error = $5, current_wait = null,
         finished_at = now(), updated_at = now()
   where run_id = $1
     and ($2::bigint is null or current_attempt_id = $2)
     and status not in ('completed', 'failed', 'cancelled')
  returning run_id
), fact as (
  insert into {schema}.ledger (run_id, type, fact)
  select run_id, $6, $7 from settled
  on conflict (run_id) where type in ('run.completed', 'run.failed', 'run.cancelled') do nothing
), closed as (
  -- The run ended: its other attempts that recorded no end are over too. Settled
  -- by its current attempt ($2), every other one; settled from outside (cancel,
  -- an operator, the reconciler), only those whose worker is gone: a live
  -- worker's attempt may still be executing a step, and ends itself when its
  -- next engine call finds the run cancelled.
  update {schema}.attempts a
     set outcome = 'lease_lost', finished_at = now(),
         error = coalesce(a.error, jsonb_build_object(
           'reason', 'the run ended without this attempt'))
    from settled s
   where a.run_id = s.run_id and a.outcome is null
     and a.attempt_id is distinct from $2
     and a.attempt_id is distinct from $8  -- the caller's own claim, which it ends itself
     and ($2::bigint is not null or not {schema}.attempt_worker_live(a.worker_id))
)
select run_id from settled;

-- name: run_facts
select type, fact, created_at from {schema}.ledger where run_id = $1 order by fact_id;

-- name: insert_signal
insert into {schema}.signals (run_id, event_key, payload)
values ($1, $2, $3)
on conflict (run_id, event_key) do nothing
returning received_at;

-- name: consume_signal
-- The first claim of a signal marks it consumed; a replay of the same attempt
-- (or a later one, after a crash) still reads the payload it resolved with.
update {schema}.signals
   set consumed_at = coalesce(consumed_at, now()),
       consumed_by_attempt = coalesce(consumed_by_attempt, $3)
 where run_id = $1 and event_key = $2
returning payload;

-- name: lane_state
-- What a loop needs to decide on a claimed run, plus the play and input to run
-- it (never changed after submit); the envelope comes from begin_attempt.
-- lane_claiming is the stamped lane's; adopter_claiming the adopter's lane.
select r.run_id, r.release_id, r.adopted_release_id, r.adopted_queue, r.status,
       r.current_wait, r.play, r.input,
       coalesce(l.status = 'claiming', false) as lane_claiming,
       coalesce(al.status = 'claiming', false) as adopter_claiming
  from {schema}.runs r
  left join {schema}.releases l on l.queue = r.queue
  left join {schema}.releases al on al.queue = r.adopted_queue
 where r.task_id = $1;

-- name: register_release
-- Marks a lane claiming, but never moves a retired lane back: returns its status.
insert into {schema}.releases as l (queue, status, release_ids)
values ($1, 'claiming', array[$2::text])
on conflict (queue) do update
   set release_ids = case when $2 = any(l.release_ids) then l.release_ids
                          else l.release_ids || $2 end,
       updated_at = now()
returning status;

-- name: set_release_status
insert into {schema}.releases as l (queue, status, release_ids, retired_at)
values ($1, $2, array[$3::text], case when $2 = 'retired' then now() end)
on conflict (queue) do update
   set status = excluded.status,
       release_ids = case when $3 = any(l.release_ids) then l.release_ids
                          else l.release_ids || $3 end,
       retired_at = case when excluded.status = 'retired' then coalesce(l.retired_at, now()) end,
       -- set_release_status always comes with ensure_queue: the queue exists again.
       pruned_at = null,
       updated_at = now()
returning status;

-- name: lane_names
-- What `lanes retire`/`activate` accept without --force: every registered lane
-- (its first spelling, oldest first), then engine queues no lane row names.
select name from (
  select coalesce(release_ids[1], queue) as name, 0 as kind, created_at
    from {schema}.releases
  union all
  -- A queue only a submit created: its runs carry the release id it was stamped with.
  select coalesce((select r.release_id from {schema}.runs r
                    where r.queue = q.queue_name limit 1), q.queue_name), 1, null
    from absurd.queues q
   where not exists (select 1 from {schema}.releases l where l.queue = q.queue_name)
) known
order by kind, created_at, name;

-- name: lane_known
-- Whether anything ever used this queue: a lane row (a worker booted, or an
-- operator retired it) or the engine queue (created by the first submit or boot).
select exists (select 1 from {schema}.releases where queue = $1)
    or exists (select 1 from absurd.queues where queue_name = $1);

-- name: lane_registry
-- Every lane with its status; whether it still holds non-terminal runs
-- (continuation loops attach to retired lanes with open runs, not only parked
-- ones, so expired leases there are swept, and detach when none is left);
-- whether it holds open runs adopted by lane $1 (the caller's: its loop there
-- finishes them, whatever the lane's status) or by any other lane than its
-- own (its own loop must skip those); and whether it holds work only its own
-- release may run (a retired lane with such work is draining; without, drained).
select l.queue, l.status, l.release_ids, l.created_at,
       exists (select 1 from {schema}.runs r
                where r.queue = l.queue
                  and r.status not in ('completed', 'failed', 'cancelled')) as has_open,
       exists (select 1 from {schema}.runs r
                where coalesce(r.adopted_queue, r.queue) = $1
                  and r.queue = l.queue
                  and r.adopted_queue is not null
                  and r.status not in ('completed', 'failed', 'cancelled')) as mine_open,
       exists (select 1 from {schema}.runs r
                where r.queue = l.queue
                  and r.adopted_queue is not null
                  and r.adopted_queue <> l.queue
                  and r.status not in ('completed', 'failed', 'cancelled')) as foreign_adopted,
       {schema}.lane_needs_own(l.queue) as draining_work
  from {schema}.releases l;

-- name: lane_draining_work
-- Whether lane $1 holds an open run that only its own release may run: its
-- effective lane and not parked in a wait.
select {schema}.lane_needs_own($1);

-- name: report_lanes
-- The drain report's lanes: every registered lane, its live workers (worker_live:
-- a heartbeat within 60 s, no stop mark) with the plays each registers. A
-- pruned lane is `hidden` from the list while no open run names it (`lanes
-- show` and `lanes wait` still find it: drained, safe to stop, pruned).
select l.queue, l.status, l.release_ids, l.created_at, l.retired_at,
       -- Pruned while its engine queue is gone: a submit or a boot made it again.
       case when exists (select 1 from absurd.queues q where q.queue_name = l.queue)
            then null else l.pruned_at end as pruned_at,
       l.pruned_at is not null
         and not exists (select 1 from {schema}.runs r
                          where coalesce(r.adopted_queue, r.queue) = l.queue
                            and r.status not in ('completed', 'failed', 'cancelled')) as hidden,
       coalesce((select jsonb_agg(jsonb_build_object('workerId', w.worker_id,
                                                     'plays', to_jsonb(w.plays))
                                  order by w.worker_id)
                   from {schema}.workers w
                  where w.queue = l.queue
                    and {schema}.worker_live(w.heartbeat_at, w.stopped_at)), '[]'::jsonb) as workers
  from {schema}.releases l
 order by l.created_at, l.queue;

-- name: prunable_lanes
-- Retired lanes, retired more than $1 seconds ago, not yet pruned, whose
-- engine queue no open run uses (adopted runs keep their stamped queue's task).
-- `live`: a worker of the lane is still live (its loops poll the queue), so the
-- lane is not pruned yet: stop its machines first.
select l.queue, l.release_ids, l.retired_at,
       exists (select 1 from {schema}.workers w
                where w.queue = l.queue
                  and {schema}.worker_live(w.heartbeat_at, w.stopped_at)) as live
  from {schema}.releases l
 where l.status = 'retired' and l.pruned_at is null
   and l.retired_at < now() - make_interval(secs => $1)
   and not exists (select 1 from {schema}.runs r
                    where r.queue = l.queue
                      and r.status not in ('completed', 'failed', 'cancelled'))
 order by l.retired_at, l.queue;

-- name: queue_has_open_runs
select exists (select 1 from {schema}.runs
                where queue = $1 and status not in ('completed', 'failed', 'cancelled'));

-- name: prune_lane
-- Under the lane row's lock, re-checked: still retired, still no open run, no
-- live worker of the lane.
update {schema}.releases l
   set pruned_at = now(), updated_at = now()
 where l.queue = $1 and l.status = 'retired' and l.pruned_at is null
   and not exists (select 1 from {schema}.runs r
                    where r.queue = l.queue
                      and r.status not in ('completed', 'failed', 'cancelled'))
   and not exists (select 1 from {schema}.workers w
                    where w.queue = l.queue
                      and {schema}.worker_live(w.heartbeat_at, w.stopped_at))
returning l.queue;

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
         case when r.status = 'running' then 'inFlight'
              when r.status = 'retrying' then 'retrying'
              when r.status = 'queued' and r.current_attempt_id is null then 'fresh'
              when r.status = 'queued' then 'handedBack'
              when r.current_wait->>'kind' = 'sleep' then 'parkedSleep'
              else 'parkedEvent' end as bucket,
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
       min(stamped) as release_id, claiming_stamp
  from open
 group by lane, bucket, needs_own, claiming_stamp;

-- name: report_adopted
-- Open runs adopted away from their stamped lane, per (stamped lane, adopter).
select queue, adopted_queue, count(*) as runs
  from {schema}.runs
 where status not in ('completed', 'failed', 'cancelled')
   and adopted_queue is not null and adopted_queue <> queue
 group by queue, adopted_queue;

-- name: heartbeat
insert into {schema}.workers as w (worker_id, release_id, queue, hostname, pid, concurrency, plays)
values ($1, $2, $3, $4, $5, $6, $7)
on conflict (worker_id) do update
   set heartbeat_at = now(), stopped_at = null, plays = excluded.plays;

-- name: worker_stopped
update {schema}.workers set stopped_at = now() where worker_id = $1;

-- name: maintenance_lanes
-- The lanes a maintenance pass reconciles, and whether each has its engine
-- queue. `lanes prune` dropped a pruned lane's queue on purpose (a submit may
-- have created it again: then it is reconciled as any other).
select l.queue, l.status, l.release_ids,
       exists (select 1 from absurd.queues q where q.queue_name = l.queue) as engine_queue
  from {schema}.releases l
 where l.pruned_at is null
    or exists (select 1 from absurd.queues q where q.queue_name = l.queue)
 order by l.queue;
