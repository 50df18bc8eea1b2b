-- Store queries on lanes and workers: the registry, liveness, prune
-- (worker/db/store/lanes.py).
-- Each starts with a `-- name: <name>` line and is run by one typed method.
-- `{schema}` is the store schema and `{checkpoints}` a queue's engine checkpoint
-- table, quoted when the text is filled in (worker/db/sql.py). Values are always
-- bound parameters.

-- name: claiming_lanes_for_play
-- Claiming lanes, newest first, with a live worker whose app registers play $1:
-- where a retry of that play can run. release_ids: every spelling, for the dev check.
select l.queue, coalesce({schema}.lane_release_id(l.queue), l.queue) as release_id,
       l.release_ids
  from {schema}.releases l
 where l.status = 'claiming'
   and exists (select 1 from {schema}.workers w
                where w.queue = l.queue and {schema}.worker_live(w.heartbeat_at, w.stopped_at)
                  and $1 = any (w.plays))
 order by l.created_at desc, l.queue desc;

-- name: live_plays
-- The plays the live workers of lane $1 register.
select coalesce(array_agg(distinct p), '{}') as plays
  from {schema}.workers w cross join lateral unnest(w.plays) as p
 where w.queue = $1 and {schema}.worker_live(w.heartbeat_at, w.stopped_at);

-- name: lane_play_registered
-- Whether a live worker of lane $1 registers play $2, whether any worker of it
-- ever did, and how long run $3 has been put back in a row (its deferral streak;
-- 0 when it was not): a play nobody registered is waited for that long.
select coalesce(bool_or({schema}.worker_live(w.heartbeat_at, w.stopped_at)), false) as live,
       count(*) > 0 as ever,
       coalesce((select extract(epoch from now() - r.first_deferred_at)::float8
                   from {schema}.runs r where r.run_id = $3), 0) as deferred_s
  from {schema}.workers w
 where w.queue = $1 and $2 = any (w.plays);

-- name: lane_row
-- release_id: the lane's release id as deployed (lane_release_id, migration 0030).
select queue, status, release_ids, {schema}.lane_release_id(queue) as release_id
  from {schema}.releases where queue = $1;

-- name: register_release
-- Marks a lane claiming, but never moves a retired lane back: returns its status.
-- $2 is the release id as deployed: the lane's release_id (migration 0030) keeps
-- the first one a worker registered (older builds write only release_ids).
-- A release id and a worktree suffix may name one queue (release foo and suffix
-- foo: runs_foo). Neither kind joins a lane that holds a spelling of the other
-- (lane_is_dev per spelling, 0035): decided under the row's lock, no row returned
-- (the caller refuses to boot). A lane older builds mixed is refused to both. A
-- dev id never takes a queue the registry deploys a release to (`releases deploy`
-- before that release's first machine booted).
insert into {schema}.releases as l (queue, status, release_ids, release_id)
select $1, 'claiming', array[$2::text], $2
 where not ({schema}.lane_is_dev(array[$2::text])
            and exists (select 1 from {schema}.deployments d where d.queue = $1))
on conflict (queue) do update
   set release_ids = case when $2 = any(l.release_ids) then l.release_ids
                          else l.release_ids || $2 end,
       release_id = coalesce(l.release_id, $2),
       updated_at = now()
 where not exists (select 1 from unnest(l.release_ids) r
                    where {schema}.lane_is_dev(array[r]) <> {schema}.lane_is_dev(array[$2::text]))
returning status;

-- name: lane_spellings
-- Every release id lane $1 is known by: what workers registered, then what the
-- registry deployed to it (what a refusal of the other kind names).
select coalesce((select l.release_ids from {schema}.releases l where l.queue = $1), '{}')
       || coalesce((select array_agg(d.release_id order by d.deployed_at)
                      from {schema}.deployments d where d.queue = $1), '{}');

-- name: set_release_status
-- `lanes retire` / `activate` of release id $3. As register_release: a spelling never
-- joins a lane that holds one of the other kind (release vs dev), no row returned;
-- only retiring a lane by a spelling it already has is always done (a mixed lane too).
insert into {schema}.releases as l (queue, status, release_ids, retired_at)
select $1, $2, array[$3::text], case when $2 = 'retired' then now() end
 where not ({schema}.lane_is_dev(array[$3::text])
            and exists (select 1 from {schema}.deployments d where d.queue = $1))
on conflict (queue) do update
   set status = excluded.status,
       release_ids = case when $3 = any(l.release_ids) then l.release_ids
                          else l.release_ids || $3 end,
       retired_at = case when excluded.status = 'retired' then coalesce(l.retired_at, now()) end,
       -- set_release_status always comes with ensure_queue: the queue exists again.
       pruned_at = null,
       updated_at = now()
 where ($2 = 'retired' and $3 = any(l.release_ids))
    or not exists (select 1 from unnest(l.release_ids) r
                    where {schema}.lane_is_dev(array[r]) <> {schema}.lane_is_dev(array[$3::text]))
returning status;

-- name: lane_names
-- What `lanes retire`/`activate` accept without --force: every registered lane
-- (its release id as deployed, oldest first), then engine queues no lane row names that
-- hold runs of this store (an engine queue of another system is no lane).
select name from (
  select coalesce({schema}.lane_release_id(queue), queue) as name, 0 as kind, created_at
    from {schema}.releases
  union all
  -- A queue only a submit created: its runs carry the release id it was stamped with.
  select {schema}.release_as_deployed(r.release_id), 1, null
    from absurd.queues q
    cross join lateral (select r.release_id from {schema}.runs r
                         where r.queue = q.queue_name limit 1) r
   where not exists (select 1 from {schema}.releases l where l.queue = q.queue_name)
) known
order by kind, created_at, name;

-- name: lane_known
-- Whether lane-worker ever used this queue: a lane row (a worker booted, or an
-- operator retired it), a run of this store submitted there (its first submit
-- created the queue), or a task of such a run still in the engine queue (its
-- runs were moved away). An engine queue alone may be another system's (the
-- TypeScript app's): not a lane. Open runs first (their index).
select exists (select 1 from {schema}.releases where queue = $1)
    or exists (select 1 from {schema}.runs
                where queue = $1 and status not in ('completed', 'failed', 'cancelled'))
    or exists (select 1 from {schema}.runs where queue = $1)
    or {schema}.queue_holds_own_task($1);

-- name: lane_registry
-- Every lane with its status; whether it still holds non-terminal runs or
-- pending sandbox cleanups
-- (continuation loops attach to retired lanes with open runs, not only parked
-- ones, so expired leases there are swept, and detach when none is left);
-- whether it holds open runs adopted by lane $1 (the caller's: its loop there
-- finishes them, whatever the lane's status) or by any other lane than its
-- own (its own loop must skip those); and whether it holds work only its own
-- release may run (a retired lane with such work is draining; without, drained);
-- and whether it is older than lane $1 (lane_older: what $1 may adopt from).
select l.queue, l.status, l.release_ids, l.created_at,
       {schema}.lane_older(l.queue, $1) as older_than_mine,
       exists (select 1 from {schema}.runs r
                where r.queue = l.queue
                  and r.status not in ('completed', 'failed', 'cancelled'))
         -- a sandbox cleanup waiting there (migration 0011): a newer release's
         -- continuation loop takes it once the lane is retired
         or exists (select 1 from {schema}.run_sandboxes x
                      where x.cleanup_queue = l.queue and x.cleanup = 'pending') as has_open,
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
   -- The caller checks each queue's unfinished tasks of any kind (queue_tasks: a
   -- sandbox cleanup, another system's task), a queue per statement, so no
   -- statement locks every retired lane's task table.
 order by l.retired_at, l.queue;

-- name: idle_dev_lanes
-- Claiming dev lanes (every release id a worker registered for it is `dev` or
-- `dev-...`: a worktree's or a preview's, lane_is_dev per spelling, migration 0035;
-- a queue a release ever registered is never one) none of whose workers was live
-- for over $1 seconds (its last heartbeat, else its last registration), with
-- whether it still holds an open run or a pending sandbox cleanup (`busy`: kept,
-- shown idle). Maintenance retires the others (retire_idle_dev_lane).
-- An open run is the lane's whether it was submitted there (queue) or adopted by
-- it (adopted_queue: a worktree's continuation loop adopted it before 0035): a
-- lane retired holding an adopted run left it with no lane that may claim it.
-- A lane whose last worker (the last seen) ran a build older than $2 (the first
-- whose boot activates a retired dev lane again; null version: before 0.2.0) is
-- never retired: that build's worker, coming back, would find its lane retired
-- and refuse to boot as a drained release does.
select l.queue, coalesce({schema}.lane_release_id(l.queue), l.queue) as release_id,
       s.last_seen,
       exists (select 1 from {schema}.runs r
                where (r.queue = l.queue or r.adopted_queue = l.queue)
                  and r.status not in ('completed', 'failed', 'cancelled'))
         or exists (select 1 from {schema}.run_sandboxes x
                     where x.cleanup_queue = l.queue and x.cleanup = 'pending') as busy
  from {schema}.releases l
  cross join lateral (
    select greatest(l.updated_at, max(w.heartbeat_at)) as last_seen,
           coalesce(bool_or({schema}.worker_live(w.heartbeat_at, w.stopped_at)), false) as live
      from {schema}.workers w where w.queue = l.queue) s
 where l.status = 'claiming'
   and cardinality(l.release_ids) > 0
   and not exists (select 1 from unnest(l.release_ids) r
                    where not {schema}.lane_is_dev(array[r]))
   and not s.live
   and s.last_seen < now() - make_interval(secs => $1)
   and not exists (select 1 from (select w.version from {schema}.workers w
                                   where w.queue = l.queue
                                   order by w.heartbeat_at desc, w.started_at desc
                                   limit 1) last
                    where coalesce((regexp_match(last.version, '^(\d+)\.(\d+)\.(\d+)'))::numeric[],
                                   array[]::numeric[])
                          < string_to_array($2, '.')::numeric[])
 order by s.last_seen, l.queue;

-- name: retire_idle_dev_lane
-- Retire dev lane $1, re-checked under its row lock: still claiming, still a dev
-- lane only, no live worker, none seen for $2 seconds, no open run, no pending
-- sandbox cleanup (an open run submitted to it or adopted by it), not a release
-- the registry deploys, its last worker not of a build older than $3 (see
-- idle_dev_lanes). `lanes prune`'s rules (and maintenance's LANE_WORKER_PRUNE_AFTER)
-- take it from there; its worker booting again activates it (activate_dev_lane).
update {schema}.releases l
   set status = 'retired', retired_at = now(), updated_at = now()
 where l.queue = $1 and l.status = 'claiming'
   and cardinality(l.release_ids) > 0
   and not exists (select 1 from unnest(l.release_ids) r
                    where not {schema}.lane_is_dev(array[r]))
   and l.updated_at < now() - make_interval(secs => $2)
   and not exists (select 1 from {schema}.workers w
                    where w.queue = l.queue
                      and (w.heartbeat_at >= now() - make_interval(secs => $2)
                           or {schema}.worker_live(w.heartbeat_at, w.stopped_at)))
   and not exists (select 1 from {schema}.runs r
                    where (r.queue = l.queue or r.adopted_queue = l.queue)
                      and r.status not in ('completed', 'failed', 'cancelled'))
   and not exists (select 1 from {schema}.run_sandboxes x
                    where x.cleanup_queue = l.queue and x.cleanup = 'pending')
   and not exists (select 1 from {schema}.deployments d
                    where d.queue = l.queue and d.role in ('current', 'previous', 'candidate'))
   and not exists (select 1 from (select w.version from {schema}.workers w
                                   where w.queue = l.queue
                                   order by w.heartbeat_at desc, w.started_at desc
                                   limit 1) last
                    where coalesce((regexp_match(last.version, '^(\d+)\.(\d+)\.(\d+)'))::numeric[],
                                   array[]::numeric[])
                          < string_to_array($3, '.')::numeric[])
returning l.queue;

-- name: activate_dev_lane
-- A worker of dev lane $1 boots: the lane claims again, retired or pruned (by hand
-- or by maintenance's idle rule), so a worktree that comes back just works. Only a
-- lane every spelling of which is a dev one: a release lane stays retired.
update {schema}.releases l
   set status = 'claiming', retired_at = null, pruned_at = null, updated_at = now()
 where l.queue = $1 and l.status = 'retired'
   and cardinality(l.release_ids) > 0
   and not exists (select 1 from unnest(l.release_ids) r
                    where not {schema}.lane_is_dev(array[r]))
returning l.status;

-- name: queue_tasks
-- The unfinished engine tasks of queue $1, and how many this store did not create.
select open_tasks, foreign_tasks from {schema}.queue_open_tasks($1);

-- name: queue_holds_foreign_task
-- Whether the queue's engine tasks ({tasks}) hold one, in any state (a finished one
-- too, until the engine's cleanup removes it), that this store did not create: no
-- run row names it as its task or, a `play-run` task, by the runId of its params (a
-- task `lanes move` or `runs retry` replaced; another system's task carrying one of
-- our runIds is still its own), no sandbox cleanup row names it. Such a queue is
-- another system's too (the TypeScript app's): `lanes prune` keeps it. The caller
-- checks first that the engine has the queue.
select exists (
  select 1 from {tasks} t
   where not exists (select 1 from {schema}.runs r where r.task_id = t.task_id)
     and not exists (
           select 1 from {schema}.runs r
            where r.run_id = case
                    when t.task_name = 'play-run' and t.params->>'runId'
                         ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                    then (t.params->>'runId')::uuid end)
     and not exists (select 1 from {schema}.run_sandboxes x where x.cleanup_task_id = t.task_id));

-- name: record_created_queue
-- Record that this store created engine queue $1, in the transaction that
-- created it (migration 0024): `lanes prune` drops only a recorded queue. A
-- queue made again after a prune replaces the old record.
insert into {schema}.created_queues (queue, queue_created_at)
select q.queue_name, q.created_at from absurd.queues q where q.queue_name = $1
on conflict (queue) do update
   set queue_created_at = excluded.queue_created_at, recorded_at = now(), legacy = false;

-- name: queue_created_by_store
-- Whether engine queue $1 is the one this store recorded creating (same name and
-- engine created_at); null when the engine has no such queue. False: another
-- system made it (the TypeScript app), or made it again after it was dropped by
-- other means, or a build before migration 0024 made it: `lanes prune` keeps it.
select exists (select 1 from {schema}.created_queues c
                where c.queue = q.queue_name and c.queue_created_at = q.created_at)
  from absurd.queues q
 where q.queue_name = $1;

-- name: forget_created_queue
-- `lanes prune` dropped queue $1: whoever makes it next owns it.
delete from {schema}.created_queues where queue = $1;

-- name: prune_lane
-- Under the lane row's lock, re-checked: still retired, still no open run, no
-- live worker of the lane, no pending sandbox cleanup; and last, with every
-- writer of the queue's tasks held off until commit, no unfinished task of any
-- kind (queue_idle_locked, migration 0020).
update {schema}.releases l
   set pruned_at = now(), updated_at = now()
 where l.queue = $1 and l.status = 'retired' and l.pruned_at is null
   and not exists (select 1 from {schema}.runs r
                    where r.queue = l.queue
                      and r.status not in ('completed', 'failed', 'cancelled'))
   and not exists (select 1 from {schema}.workers w
                    where w.queue = l.queue
                      and {schema}.worker_live(w.heartbeat_at, w.stopped_at))
   and not exists (select 1 from {schema}.run_sandboxes x
                    where x.cleanup_queue = l.queue and x.cleanup = 'pending')
   and {schema}.queue_idle_locked(l.queue)
returning l.queue;

-- name: heartbeat
-- $8: the machine it runs on (migration 0012); $9: it is ready (serving): the
-- first such beat records when it became ready. $10: its build's version; $11:
-- its loops that do not claim, each with failingForSeconds, kept as `since` on
-- the database's clock (migration 0021); an empty array stores null.
insert into {schema}.workers as w (worker_id, release_id, queue, hostname, pid, concurrency, plays,
                                   machine_id, ready_at, version, claim_failures)
values ($1, $2, $3, $4, $5, $6, $7, $8, case when $9 then now() end, $10,
        (select jsonb_agg(f - 'failingForSeconds'
                          || jsonb_build_object('since', now() - make_interval(
                               secs => coalesce((f ->> 'failingForSeconds')::float8, 0))))
           from jsonb_array_elements($11::jsonb) f))
on conflict (worker_id) do update
   set heartbeat_at = now(), stopped_at = null, plays = excluded.plays,
       machine_id = excluded.machine_id,
       ready_at = coalesce(w.ready_at, excluded.ready_at),
       version = excluded.version, claim_failures = excluded.claim_failures;

-- name: worker_stopped
update {schema}.workers set stopped_at = now() where worker_id = $1;

-- name: maintenance_lanes
-- The lanes a maintenance pass reconciles, and whether each has its engine
-- queue. `lanes prune` dropped a pruned lane's queue on purpose (a submit may
-- have created it again: then it is reconciled as any other). A lane with no
-- open run has nothing to settle (the reconcile reads only open runs), so it is
-- left out unless its queue is missing (that is reported): a week of drained
-- lanes does not slow the rotation of those that hold runs.
select l.queue, l.status, l.release_ids, {schema}.lane_release_id(l.queue) as release_id,
       q.queue_name is not null as engine_queue
  from {schema}.releases l
  left join absurd.queues q on q.queue_name = l.queue
 where (l.pruned_at is null or q.queue_name is not null)
   and (q.queue_name is null
        or exists (select 1 from {schema}.runs r
                    where r.queue = l.queue
                      and r.status not in ('completed', 'failed', 'cancelled')))
 order by l.queue;

-- name: maintained_queues
-- Every engine queue, and whether it is lane-worker's to clean: a lane row names
-- it (a worker registered it, an operator retired it; a pruned lane's queue that
-- another system made again too: only this store's tasks are ever deleted), a
-- run of this store was submitted there (a queue only a submit created), or this
-- store recorded creating it (migration 0024: a queue only the SQL API's submit
-- created, whose runs `lanes move` took elsewhere, still holds their old tasks).
-- A sandbox cleanup goes to its run's queue or adopter's lane, both named so. Any
-- other queue is another system's (the TypeScript app's own): never cleaned.
-- Index probes per queue (runs_queue_idx, migration 0022; primary keys), no
-- engine table read.
select q.queue_name as queue,
       (exists (select 1 from {schema}.releases l where l.queue = q.queue_name)
        or exists (select 1 from {schema}.runs r where r.queue = q.queue_name)
        or exists (select 1 from {schema}.created_queues c
                    where c.queue = q.queue_name)) as own
  from absurd.queues q
 order by q.queue_name;

-- name: clean_own
-- One bounded cleanup batch of queue $1's finished tasks and old events that this
-- store created, by lane-worker's own retention (migration 0023), not the queue's policy.
select tasks_deleted, events_deleted from {schema}.clean_own($1);

-- name: owns_task
-- Whether this store created engine task $1: a run's (its current task; a task
-- `lanes move` replaced is named by the run its params name, which the caller
-- checks first) or a sandbox cleanup's (the pending ones by their index).
select exists (select 1 from {schema}.runs where task_id = $1)
    or exists (select 1 from {schema}.run_sandboxes
                where cleanup = 'pending' and cleanup_task_id = $1)
    or exists (select 1 from {schema}.run_sandboxes where cleanup_task_id = $1);

-- name: prepare_lane_queue
-- The lane's engine queue and its NOTIFY trigger, made with the store owner's
-- rights (migration 0042): for a worker connecting as its own role, which has
-- no DDL in the engine schema (issue 33). True: the trigger was installed now.
select {schema}.prepare_lane_queue($1);
