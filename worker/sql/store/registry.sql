-- Store queries of the release registry and the scaler (worker/db/store/registry.py,
-- migration 0012). Each starts with a `-- name: <name>` line and is run by one
-- typed method.

-- name: deploy_release
-- deploy_release (0012), refused while the registry is held unless $6 (0033); with a
-- gate ($7, a non-empty array; $8 its timeout in seconds) the release is the
-- candidate and the current release stays current (0050).
select {schema}.deploy_release_gated($1, $2, $3, $4, $5, $6, $7, $8);

-- name: retire_superseded
select {schema}.retire_superseded($1);

-- name: deployments
-- Every deployed release with its lane's status and its live workers (and how
-- many of them are ready, and how many run each build), newest deploy first.
select d.release_id, d.queue, d.image, d.desired, d.role, d.deployed_at, d.deployed_by,
       d.retired_at, d.retired_by, l.status as lane_status,
       coalesce(w.live, 0) as live_workers, coalesce(w.ready, 0) as ready_workers,
       coalesce(w.machines, '{}') as live_machines,
       coalesce(w.ready_machines, '{}') as ready_machines,
       coalesce(b.builds, '{}') as live_builds,
       -- Its machines' boot failure as the scaler recorded it for this deploy (0047).
       case when d.boot_failed_for = d.deployed_at then d.boot_failed end as boot_failed,
       -- Its gate (0050): what, how long, since when (seconds), and how it ended.
       d.gate, d.gate_timeout_s,
       extract(epoch from now() - d.gate_started_at)::float8 as gate_age_s,
       d.gate_outcome, d.gate_reason, d.gate_run
  from {schema}.deployments d
  left join {schema}.releases l on l.queue = d.queue
  left join lateral (
    -- Ready: it has the ready mark and every loop of it claims (migration 0021), as its
    -- /readyz says: a machine whose claims keep failing must not take over a release.
    select count(*) as live,
           count(*) filter (where x.ready_at is not null and x.claim_failures is null) as ready,
           array_agg(distinct x.machine_id) filter (where x.machine_id is not null) as machines,
           array_agg(distinct x.machine_id)
             filter (where x.machine_id is not null and x.ready_at is not null
                       and x.claim_failures is null) as ready_machines
      from {schema}.workers x
     where x.queue = d.queue and {schema}.worker_live(x.heartbeat_at, x.stopped_at)
  ) w on true
  -- Its live workers per build (migration 0021; '' for a build before 0.2.0).
  left join lateral (
    select jsonb_object_agg(v.version, v.workers) as builds
      from (select coalesce(x.version, '') as version, count(*) as workers
              from {schema}.workers x
             where x.queue = d.queue and {schema}.worker_live(x.heartbeat_at, x.stopped_at)
             group by 1) v
  ) b on true
 order by d.deployed_at desc, d.release_id;

-- name: deployment_events
select event_id, at, release_id, action, actor, detail
  from {schema}.deployment_events
 where ($1::text is null or release_id = $1)
 order by event_id desc
 limit $2;

-- name: record_event
insert into {schema}.deployment_events (release_id, action, actor, detail)
values ($1, $2, $3, $4);

-- name: boot_failed_set
-- The release $1's machines keep failing to boot (0047): its word $2, for the
-- deploy of $3 only (a deploy since then is not what failed).
update {schema}.deployments
   set boot_failed = $2, boot_failed_for = deployed_at
 where release_id = $1 and deployed_at = $3;

-- name: boot_failed_clear
-- The release $1's machines boot again (or exit otherwise): no record (0047).
update {schema}.deployments
   set boot_failed = null, boot_failed_for = null
 where release_id = $1 and boot_failed is not null;

-- name: scaler_beat
-- The active scaler's pass: who, with which backend, what it saw per release.
insert into {schema}.scaler_state as s (singleton, holder, backend, beat_at, releases)
values (true, $1, $2, now(), $3)
on conflict (singleton) do update
   set holder = excluded.holder, backend = excluded.backend, beat_at = now(),
       releases = excluded.releases;

-- name: scaler_state
select holder, backend, beat_at, extract(epoch from now() - beat_at)::float8 as age_s, releases
  from {schema}.scaler_state;

-- name: store_id
-- The store's identity (migration 0013): the scaler marks its machines with it.
select {schema}.store_id();

-- name: retire_superseded_by
-- retire_superseded, only while $2 (deployed at $3) is still the current release
-- and the registry is not held (0033).
select {schema}.retire_superseded_unless_held($1, $2, $3);

-- name: hold_releases
select {schema}.hold_releases($1, $2);

-- name: resume_releases
select {schema}.resume_releases($1);

-- name: release_hold
select held_by, held_at, reason from {schema}.release_hold;

-- name: create_sent
-- A create the scaler is about to send (migration 0026): counted from now on.
insert into {schema}.scaler_creates (create_key, release_id, image) values ($1, $2, $3);

-- name: create_made
-- The machine the create $1 made.
update {schema}.scaler_creates set machine_id = $2 where create_key = $1;

-- name: create_refused
-- The backend refused the create $1: it made nothing.
delete from {schema}.scaler_creates where create_key = $1;

-- name: creates_seen
-- The machines $1 the backend now lists; the machines $2 it no longer lists.
with gone as (
  delete from {schema}.scaler_creates where machine_id = any($2::text[]) returning 1
)
update {schema}.scaler_creates set listed = true
 where machine_id = any($1::text[]) and not listed and not (machine_id = any($2::text[]));

-- name: creates_remembered
-- What a scaler becoming active remembers of the creates: the rows past their age
-- ($1 s unlisted, $2 s without a machine id) or of a release the registry no
-- longer has are forgotten first. age_s on the database's clock.
with forgotten as (
  delete from {schema}.scaler_creates c
   where (not c.listed and c.sent_at < now() - make_interval(secs => $1))
      or (c.machine_id is null and c.sent_at < now() - make_interval(secs => $2))
      or not exists (select 1 from {schema}.deployments d where d.release_id = c.release_id)
  returning c.create_key
)
select c.create_key, c.release_id, c.image, c.machine_id, c.listed,
       extract(epoch from now() - c.sent_at)::float8 as age_s
  from {schema}.scaler_creates c
 where c.create_key not in (select create_key from forgotten)
 order by c.sent_at, c.create_key;

-- name: gate_begun
-- The candidate's gate starts (once); seconds since, or null (0050).
select {schema}.gate_begun($1, $2);

-- name: gate_passed
select {schema}.gate_passed($1, $2, $3, $4);

-- name: gate_failed
select {schema}.gate_failed($1, $2, $3, $4, $5);

-- name: gate_submit_run
-- Gate run $3 of the candidate $1 deployed at $2, key $4 (0051: owner's rights, the
-- deployment's own gate only): submit_run's answer.
select {schema}.gate_submit_run($1, $2, $3, $4);

-- name: gate_run_status
-- A gate run's run_status (0051).
select {schema}.gate_run_status($1);

-- name: gate_cancel_run
-- Cancel a gate run (0051), as an operator's cancel.
select {schema}.gate_cancel_run($1, $2);
