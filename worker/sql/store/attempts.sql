-- Store queries on attempts: recording a claim, the writes fenced by the current
-- attempt, its end, and closing attempts left behind (worker/db/store/attempts.py).
-- Each starts with a `-- name: <name>` line and is run by one typed method.
-- `{schema}` is the store schema and `{checkpoints}` a queue's engine checkpoint
-- table, quoted when the text is filled in (worker/db/sql.py). Values are always
-- bound parameters.

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

-- name: begin_attempt
-- Own and adopt take the run over (status running, fence moves to this
-- attempt, the wait it was parked in is over); defer and refuse only record
-- that the claim happened. Returns the envelope and the wait as of the fence
-- move (an older attempt may still write them until then, never after), the
-- run's step-key mapping (stamped by its first execution: $9), the engine
-- checkpoints the attempt resumes from (queue $11, task $10, engine run $2:
-- read here, not in a second round trip; only when taken over, and not on a
-- run's first execution, which has none), and the
-- database's clock, which every duration of the attempt is measured on. The
-- statement is the store's begin_attempt (migration 0017), which the own loop's
-- claim also calls.
select * from {schema}.begin_attempt($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);

-- name: complete_attempt
-- The engine's complete, the settle and the attempt's end in one statement
-- (migration 0016); LW001 when a newer claim owns the run. The output ($3) is
-- JSON text, encoded once by the writer (as a batch sends it); the store builds
-- the run.completed fact from it (a null fact, migration 0032).
select {schema}.complete_attempt($1, $2, $3::text::jsonb, $4, $5, null);

-- name: write_sets
-- A batch's checkpoints and completions as typed arrays (migration 0027), one
-- statement: the kind and position of each write that failed, undone alone.
-- JSON values come encoded, once, by their writer ($5, $10); the store builds
-- each run.completed fact from its output (null facts, migration 0032).
select 'checkpoint' as kind, write_at, error_code
  from {schema}.write_checkpoints($1, $2::text[], $3::uuid[], $4::text[],
                                  $5::text[]::jsonb[], $6::uuid[], $7::integer[])
union all
select 'complete', write_at, error_code
  from {schema}.write_completions($1, $8::text[], $9::uuid[], $10::text[]::jsonb[],
                                  $11::uuid[], $12::bigint[], null);

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

-- name: consume_signal
-- The first claim of a signal marks it consumed; a replay of the same attempt
-- (or a later one, after a crash) still reads the payload it resolved with.
update {schema}.signals
   set consumed_at = coalesce(consumed_at, now()),
       consumed_by_attempt = coalesce(consumed_by_attempt, $3)
 where run_id = $1 and event_key = $2
returning payload;

-- name: begin_runner_attempt
-- The next runner attempt of run $1 for its detached call $2 (migration 0010).
select {schema}.begin_runner_attempt($1, $2);

-- name: take_runner_result
-- Runner attempt $2 of run $1 reported: the run resumes from its result.
update {schema}.runner_attempts
   set state = 'resolved', resolved_at = coalesce(resolved_at, now())
 where run_id = $1 and runner_attempt = $2 and reported_at is not null
   and state in ('launched', 'resolved')
returning result;

-- name: time_out_runner
-- The wait for runner attempt $2 of run $1 reached its deadline: timed out,
-- unless the report got in first (then the run resumes from it after all).
update {schema}.runner_attempts
   set state = case when reported_at is null then 'timed_out' else 'resolved' end,
       resolved_at = coalesce(resolved_at, now())
 where run_id = $1 and runner_attempt = $2
returning state, result;

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
