-- The release registry: what `lane-worker releases deploy` records and the
-- scaler (`lane-worker scaler`) acts on. Optional: a worker whose release the
-- registry does not know works as before (releases deployed by hand).
--
-- A deployed release has a role: `current` (the one release whose machines the
-- scaler keeps at its desired count; at most one), `previous` (was current; its
-- lane still claims until the current release has its machines ready, then the
-- scaler retires it) or `retired` (its lane is retired: the scaler keeps its
-- machines while it is draining and removes them once it is drained). Dev lanes
-- (`dev`, `dev-<suffix>`) are never deployed this way.

-- What a worker tells the scaler: the machine it runs on (FLY_MACHINE_ID, or
-- LANE_WORKER_MACHINE_ID from the process backend) and when it became ready.
alter table {schema}.workers
  add column machine_id text,
  add column ready_at timestamptz;

create table {schema}.deployments (
  release_id text primary key,
  queue text not null unique,
  image text not null check (char_length(image) between 1 and 1000),
  desired integer not null check (desired between 0 and 1000),
  role text not null check (role in ('current', 'previous', 'retired')),
  deployed_at timestamptz not null default now(),
  deployed_by text not null,
  retired_at timestamptz,
  retired_by text,
  updated_at timestamptz not null default now()
);
create unique index deployments_one_current on {schema}.deployments ((true))
  where role = 'current';

-- Who did what to which release, and when: deploys, rollbacks, retirements and
-- every machine the scaler started, replaced or removed.
create table {schema}.deployment_events (
  event_id bigint generated always as identity primary key,
  at timestamptz not null default now(),
  release_id text not null,
  action text not null,
  actor text not null,
  detail jsonb not null default '{}'
);
create index deployment_events_release_idx on {schema}.deployment_events (release_id, event_id);

-- Record p_release_id as the current release: image p_image, p_desired machines.
-- The current release before it becomes `previous` (it keeps claiming until the
-- scaler sees this one ready). Deploying a release whose lane is retired (a
-- rollback) makes its lane claim again now, so its machines boot claiming.
-- Deploying the current release again updates its image and count.
create or replace function {schema}.deploy_release(
  p_release_id text, p_image text, p_desired integer, p_actor text, p_action text default 'deployed')
  returns jsonb
  language plpgsql
as $$
declare
  v_release text := {schema}.lane_trim(coalesce(p_release_id, ''));
  v_queue text;
  v_previous text[];
begin
  if v_release = '' or lower(v_release) = 'dev' or lower(left(v_release, 4)) = 'dev-' then
    raise exception 'releases deploy needs a release id (not a dev lane: dev and dev-<suffix> are never deployed), got %',
      quote_literal(left(v_release, 100))
      using errcode = '22023';
  end if;
  if char_length(v_release) > 200 then
    raise exception 'a release id has at most 200 characters.' using errcode = '22023';
  end if;
  if p_image is null or {schema}.lane_trim(p_image) = '' or char_length(p_image) > 1000 then
    raise exception 'releases deploy needs an image (1..1000 characters).' using errcode = '22023';
  end if;
  if p_desired is null or p_desired not between 0 and 1000 then
    raise exception 'a release runs 0..1000 machines, not %.', p_desired using errcode = '22023';
  end if;
  v_queue := {schema}.queue_for_release(v_release);
  -- A preview's lane (a worker with DEEPLINE_ABSURD_QUEUE_SUFFIX registered it as
  -- dev-<suffix>) may share the queue name: never take it over, never retire it.
  if exists (select 1 from {schema}.releases l, unnest(l.release_ids) r
              where l.queue = v_queue and (lower(r) = 'dev' or lower(left(r, 4)) = 'dev-')) then
    raise exception 'release % maps to lane %, which a dev or preview worker serves: pick another release id.',
      quote_literal(v_release), v_queue
      using errcode = '22023';
  end if;
  -- One deploy at a time: the role changes below are read-modify-write.
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  if exists (select 1 from {schema}.deployments d
              where d.queue = v_queue and d.release_id <> v_release) then
    raise exception 'release % maps to lane %, which release % already has in the registry.',
      quote_literal(v_release), v_queue,
      quote_literal((select d.release_id from {schema}.deployments d where d.queue = v_queue))
      using errcode = '22023';
  end if;
  with demoted as (
    update {schema}.deployments
       set role = 'previous', updated_at = now()
     where role = 'current' and release_id <> v_release
    returning release_id
  )
  select coalesce(array_agg(release_id), '{}') into v_previous from demoted;
  insert into {schema}.deployments as d (release_id, queue, image, desired, role, deployed_by)
  values (v_release, v_queue, p_image, p_desired, 'current', coalesce(p_actor, 'unknown'))
  on conflict (release_id) do update
     set image = excluded.image, desired = excluded.desired, role = 'current',
         deployed_at = now(), deployed_by = excluded.deployed_by,
         retired_at = null, retired_by = null, updated_at = now();
  -- A rollback: its lane claims again (the newer lane drains when the scaler
  -- retires it, once this one's machines are ready).
  update {schema}.releases
     set status = 'claiming', retired_at = null, updated_at = now()
   where queue = v_queue and status = 'retired';
  if found then
    perform pg_notify('lane_worker_lanes', v_queue);
  end if;
  insert into {schema}.deployment_events (release_id, action, actor, detail)
  values (v_release, p_action, coalesce(p_actor, 'unknown'),
          jsonb_build_object('image', p_image, 'desired', p_desired, 'queue', v_queue,
                             'previous', to_jsonb(v_previous)));
  return jsonb_build_object('releaseId', v_release, 'queue', v_queue, 'image', p_image,
                            'desired', p_desired, 'previous', to_jsonb(v_previous));
end;
$$;

-- The scaler saw the current release's machines ready: retire, in this one
-- transaction, every `previous` release and every other claiming release lane
-- older than the current one's (deployed by hand), dev lanes aside. Returns the
-- releases it retired.
create or replace function {schema}.retire_superseded(p_actor text)
  returns text[]
  language plpgsql
as $$
declare
  v_current {schema}.deployments;
  v_lane record;
  v_retired text[] := '{}';
  v_current_created timestamptz;
begin
  perform pg_advisory_xact_lock(hashtext('lane_worker.deploy'), hashtext('{schema}'));
  select * into v_current from {schema}.deployments where role = 'current';
  if not found then
    return v_retired;
  end if;
  select created_at into v_current_created from {schema}.releases where queue = v_current.queue;
  for v_lane in
    select l.queue, coalesce(d.release_id, l.release_ids[1], l.queue) as release_id
      from {schema}.releases l
      left join {schema}.deployments d on d.queue = l.queue
     where l.queue <> v_current.queue
       and l.status = 'claiming'
       and not exists (select 1 from unnest(l.release_ids) r
                        where lower(r) = 'dev' or lower(left(r, 4)) = 'dev-')
       and (d.role = 'previous'
            or (d.release_id is null
                and v_current_created is not null and l.created_at < v_current_created
                and not exists (select 1 from unnest(l.release_ids) r
                                 where r = 'dev' or left(r, 4) = 'dev-')))
     order by l.created_at
     for update of l
  loop
    update {schema}.releases
       set status = 'retired', retired_at = coalesce(retired_at, now()), updated_at = now()
     where queue = v_lane.queue;
    update {schema}.deployments
       set role = 'retired', retired_at = now(), retired_by = coalesce(p_actor, 'unknown'),
           updated_at = now()
     where queue = v_lane.queue;
    insert into {schema}.deployment_events (release_id, action, actor, detail)
    values (v_lane.release_id, 'retired', coalesce(p_actor, 'unknown'),
            jsonb_build_object('queue', v_lane.queue, 'supersededBy', v_current.release_id));
    v_retired := v_retired || v_lane.release_id;
  end loop;
  -- A previous release whose lane no worker registered yet: its lane is created
  -- retired now, so a machine of it that boots later drains (or refuses, drained)
  -- instead of registering a lane that claims for ever.
  for v_lane in
    select d.release_id, d.queue from {schema}.deployments d where d.role = 'previous'
  loop
    insert into {schema}.releases (queue, status, release_ids, retired_at)
    values (v_lane.queue, 'retired', array[v_lane.release_id], now())
    on conflict (queue) do update
       set status = 'retired', retired_at = coalesce({schema}.releases.retired_at, now()),
           updated_at = now();
    update {schema}.deployments
       set role = 'retired', retired_at = now(), retired_by = coalesce(p_actor, 'unknown'),
           updated_at = now()
     where release_id = v_lane.release_id;
    insert into {schema}.deployment_events (release_id, action, actor, detail)
    values (v_lane.release_id, 'retired', coalesce(p_actor, 'unknown'),
            jsonb_build_object('queue', v_lane.queue, 'supersededBy', v_current.release_id,
                               'laneRegistered', false));
    v_retired := v_retired || v_lane.release_id;
  end loop;
  if cardinality(v_retired) > 0 then
    perform pg_notify('lane_worker_lanes', '');
  end if;
  return v_retired;
end;
$$;

-- What the active scaler last saw and did: one row, rewritten every pass.
-- `lane-worker releases` and `releases deploy --wait` read it (is a scaler
-- active at all? why is a release not ready?).
create table {schema}.scaler_state (
  singleton boolean primary key default true check (singleton),
  holder text not null,
  backend text not null,
  beat_at timestamptz not null default now(),
  releases jsonb not null default '{}'
);
