-- Lanes nobody serves (issue 31 §1): a submit says whether anything serves its
-- lane, and the API says which release id a worker serves.
--
-- submit_run and submit_runs accept a release no worker serves (nothing is
-- lost: a worker may boot later) and add to each result `served` (boolean) and,
-- when it is false, `warning` (one sentence naming the lane's queue and what
-- would serve it). Their other fields are unchanged.
--
-- Served: the lane's row claims (a worker registered it and it was not retired),
-- or a worker of that queue is live, or the release registry's current release
-- rides it (its machines are booting). One primary-key read answers a claiming
-- lane, the usual case; the other two are indexed reads, made only when the
-- first says no.
--
-- submit_run and submit_runs are 0025's, redefined here (same signatures) with
-- the fields added where they build their results; every line changed is marked
-- `0029`. Not wrappers: a second pass over submit_runs' results cost about a
-- tenth of a bulk submit (bench/submit.py's target is 10,000 runs/s).
--
-- worker_release_id(suffix, deploy version) gives the release id a worker
-- started with DEEPLINE_ABSURD_QUEUE_SUFFIX / DEEPLINE_RUNTIME_DEPLOY_VERSION set
-- so serves (the id as deployed: worker/lanes.py's launch_release_id) and its
-- queue, refusing (22023) what the worker's boot guard refuses
-- (worker/config/topology.py), so an app never derives it itself.

-- worker/lanes.py's sanitize_release_segment: the release id trimmed and folded,
-- an overlong one cut to a 31-character head and an 8-character sha256 tail
-- (0008's queue_for_release spells the same rule out inline).
create or replace function {schema}.lane_segment(p_release_id text)
  returns text
  language plpgsql
  immutable
as $$
declare
  v_segment text := {schema}.lane_collapse({schema}.lane_trim(coalesce(p_release_id, '')));
begin
  if char_length(v_segment) > 40 then
    v_segment := rtrim(left(v_segment, 31), '_') || '_'
                 || left(encode(sha256(convert_to(v_segment, 'UTF8')), 'hex'), 8);
  end if;
  return v_segment;
end;
$$;

-- Why the worker's boot guard refuses deploy version p_version (trimmed, not
-- blank), as a clause (no remedy, no full stop), or null: it names no lane, is not printable text, is longer than 200
-- characters, or is spelled like a dev lane (an app would submit to one queue,
-- the worker drain another). Printable is Python's str.isprintable() (Unicode
-- 14, Python 3.11): no control, format, private-use or separator character but
-- the space. Unassigned code points (which Python also calls unprintable) are
-- not told apart here: a known limit, no release id holds one.
create or replace function {schema}.deploy_version_problem(p_version text)
  returns text
  language plpgsql
  immutable
as $$
declare
  v_segment text := {schema}.lane_segment(p_version);
  v_odd text;
  v_worker_queue text;
  v_launch_queue text;
begin
  if v_segment = '' then
    return format('deploy version %s has no letter, digit or underscore, so it names no release lane',
                  quote_literal(left(p_version, 100)));
  end if;
  v_odd := substring(p_version from
    '[\u0001-\u001f\u007f-\u00a0\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2'
    '\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ue000-\uf8ff'
    '\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3'
    '\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000f0000-\U000ffffd'
    '\U00100000-\U0010fffd]');
  if v_odd is not null then
    -- Named by its code point: quoting it would print the control character.
    return format('a deploy version is printable text, and this one holds U+%s',
                  upper(lpad(to_hex(ascii(v_odd)), 4, '0')));
  end if;
  if char_length(p_version) > 200 then
    return format('a deploy version has at most 200 characters (this one has %s)',
                  char_length(p_version));
  end if;
  v_worker_queue := case when v_segment = 'dev' then 'runs' else 'runs_' || v_segment end;
  v_launch_queue := {schema}.queue_for_release(p_version);
  if v_launch_queue <> v_worker_queue or v_worker_queue = 'runs' then
    return format('deploy version %s is spelled like a dev lane (''dev'' or ''dev-...''): an app would submit its runs to %s and its worker would drain %s',
                  quote_literal(left(p_version, 100)), v_launch_queue, v_worker_queue);
  end if;
  return null;
end;
$$;

-- The release id a worker serves, and its queue, as {"releaseId", "queue"}: a
-- worker started with DEEPLINE_ABSURD_QUEUE_SUFFIX = p_queue_suffix and
-- DEEPLINE_RUNTIME_DEPLOY_VERSION = p_deploy_version (null or blank: unset).
-- A suffix outranks the deploy version: dev-<suffix folded, 32 characters>;
-- else the deploy version as deployed (trimmed); else dev. The release id is the
-- one to pass to submit_run. 22023 for what the worker refuses to boot with.
create or replace function {schema}.worker_release_id(
  p_queue_suffix text default null, p_deploy_version text default null)
  returns jsonb
  language plpgsql
  immutable
as $$
declare
  v_suffix text := {schema}.lane_trim(coalesce(p_queue_suffix, ''));
  v_version text := {schema}.lane_trim(coalesce(p_deploy_version, ''));
  v_problem text;
begin
  if v_suffix <> '' then
    v_suffix := left({schema}.lane_collapse(v_suffix), 32);
    if v_suffix = '' then
      raise exception 'queue suffix % has no letter, digit or underscore, so it names no queue: pass the worktree or preview name, or null.',
        quote_literal(left({schema}.lane_trim(p_queue_suffix), 100))
        using errcode = '22023';
    end if;
    -- The queue folds the id again: a suffix cut just before an underscore
    -- ends in one, which the queue name drops (as the worker's does).
    return jsonb_build_object('releaseId', 'dev-' || v_suffix,
                              'queue', {schema}.queue_for_release('dev-' || v_suffix));
  end if;
  if v_version = '' then
    return jsonb_build_object('releaseId', 'dev', 'queue', 'runs');
  end if;
  v_problem := {schema}.deploy_version_problem(v_version);
  if v_problem is not null then
    raise exception '%; pass the release id as deployed (for example a git sha), or null for the dev lane.',
      v_problem
      using errcode = '22023';
  end if;
  return jsonb_build_object('releaseId', v_version,
                            'queue', {schema}.queue_for_release(v_version));
end;
$$;

-- Whether anything serves lane p_queue (the lane of release p_release_id, as
-- submitted): {"served": true}, or {"served": false, "warning": ...}.
create or replace function {schema}.lane_served(p_queue text, p_release_id text)
  returns jsonb
  language plpgsql
  stable
as $$
declare
  v_status text;
  v_release text;
  v_problem text;
  v_serves text;
  v_hint text := ' (worker_release_id(suffix, deploy version) gives the release id a worker serves)';
begin
  select l.status into v_status from {schema}.releases l where l.queue = p_queue;
  if v_status = 'claiming' then
    return '{"served": true}'::jsonb;
  end if;
  if exists (select 1 from {schema}.workers w
              where w.queue = p_queue and {schema}.worker_live(w.heartbeat_at, w.stopped_at))
     or exists (select 1 from {schema}.deployments d
                 where d.queue = p_queue and d.role = 'current') then
    return '{"served": true}'::jsonb;
  end if;
  -- Not served (rare): what would serve it.
  v_release := {schema}.lane_trim(coalesce(p_release_id, ''));
  if v_status = 'retired' then
    return jsonb_build_object('served', false, 'warning', format(
      'lane %s (release %s) is retired and none of its workers is live: the run waits there until one starts or `lane-worker lanes activate %s` makes the lane claim again; to run it on the current release, submit it with that release''s id%s.',
      p_queue, quote_literal(v_release), v_release, v_hint));
  end if;
  if p_queue = 'runs' then
    v_serves := 'a worker with neither DEEPLINE_ABSURD_QUEUE_SUFFIX nor DEEPLINE_RUNTIME_DEPLOY_VERSION set';
  elsif left(v_release, 4) = 'dev-' then
    v_serves := format('a worker with DEEPLINE_ABSURD_QUEUE_SUFFIX=%s', substr(p_queue, 6));
  else
    v_problem := {schema}.deploy_version_problem(v_release);
    if v_problem is not null then
      return jsonb_build_object('served', false, 'warning', format(
        'no worker serves lane %s (release %s), and none can be deployed with that release id (%s): the run waits there; submit it with the release id a worker serves%s.',
        p_queue, quote_literal(v_release), v_problem, v_hint));
    end if;
    v_serves := format('a worker deployed with DEEPLINE_RUNTIME_DEPLOY_VERSION=%s',
                       v_release);
  end if;
  return jsonb_build_object('served', false, 'warning', format(
    'no worker serves lane %s (release %s): none registered it, none is live, and it is not the current deploy; the run waits there until %s starts%s.',
    p_queue, quote_literal(v_release), v_serves, v_hint));
end;
$$;

-- 0025's submit_run, each answer with lane_served's fields (the lines marked 0029).
create or replace function {schema}.submit_run(
  p_play text, p_input jsonb, p_release_id text,
  p_idempotency_key text default null, p_runtime_api jsonb default null,
  p_max_attempts integer default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_checked record;
  v_lane record;
  v_row {schema}.runs;
  v_run uuid := gen_random_uuid();
  v_inserted uuid;
begin
  v_checked := {schema}.checked_submit_args(p_play, p_input, p_idempotency_key, p_runtime_api,
                                            p_max_attempts);
  v_lane := {schema}.checked_release(p_release_id);
  if p_idempotency_key is not null then
    -- A repeat is answered before anything is made for it (such as the queue
    -- of a lane the first run never used).
    select * into v_row from {schema}.runs where idempotency_key = p_idempotency_key;
    if found then
      return {schema}.same_request(v_row, p_idempotency_key, p_play, v_checked.input,
                                   v_lane.queue)
             || {schema}.lane_served(v_row.queue, v_row.release_id);  -- 0029
    end if;
  end if;
  perform {schema}.ensure_lane_queue(v_lane.queue);
  insert into {schema}.runs (run_id, play, input, launch, release_id, queue, idempotency_key,
                             max_attempts)
  values (v_run, p_play, v_checked.input,
          jsonb_build_object('absurdReleaseId', v_lane.release_id, 'play', p_play,
                             'runId', v_run::text),
          v_lane.release_id, v_lane.queue, p_idempotency_key, v_checked.max_attempts)
  on conflict (idempotency_key) do nothing
  returning run_id into v_inserted;
  if v_inserted is null then  -- the same key committed meanwhile
    select * into v_row from {schema}.runs where idempotency_key = p_idempotency_key;
    return {schema}.same_request(v_row, p_idempotency_key, p_play, v_checked.input,
                                 v_lane.queue)
           || {schema}.lane_served(v_row.queue, v_row.release_id);  -- 0029
  end if;
  if v_checked.runtime_api is not null then
    insert into {schema}.run_runtime_api (run_id, api) values (v_run, v_checked.runtime_api);
  end if;
  perform {schema}.spawn_run_task(v_run, v_lane.queue, v_checked.max_attempts);
  return jsonb_build_object('runId', v_run, 'queue', v_lane.queue,
                            'releaseId', v_lane.release_id, 'created', true)
         || {schema}.lane_served(v_lane.queue, v_lane.release_id);  -- 0029
end;
$$;

-- 0025's submit_runs, each result with lane_served's fields (the lines marked
-- 0029).
create or replace function {schema}.submit_runs(p_items jsonb)
  returns jsonb
  language plpgsql
as $$
declare
  v_count integer;
  v_at integer;  -- the item being looked at, for the refusal's "item N: "
  v_first integer;
  v_args record;
  v_checked record;
  v_lanes jsonb := '{}';  -- release id as given -> [release id, queue], checked once a call
  v_lane jsonb;
  v_row {schema}.runs;
  v_made integer;
  v_state text;
  v_message text;
  v_detail text;
  v_constraint text;
  -- One slot per item (index + 1): what submit_run's arguments and checks came to.
  v_play text[] := '{}';
  v_input jsonb[] := '{}';
  v_own_release text[] := '{}';
  v_queue text[] := '{}';
  v_key text[] := '{}';
  v_api jsonb[] := '{}';
  v_max integer[] := '{}';
  v_own_run uuid[] := '{}';  -- the run the item makes, unless its key answers another
  -- What each item answers with: its own run, or the one its key names.
  v_run uuid[];
  v_release text[];
  v_new boolean[];  -- the item makes its run
  v_task uuid[];  -- each new run's engine task
  v_spawn_queue text;
  v_task_set uuid[];  -- the tasks spawned on one queue, in item order
  v_spawned_at bigint[];  -- their items' positions (index + 1)
  v_i integer;
  v_unserved jsonb;  -- 0029: queue -> its warning, for each queue of the call nobody serves
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception 'submit_runs takes a JSON array of submits, not a JSON %.',
      coalesce(jsonb_typeof(p_items), 'null')
      using errcode = '22023';
  end if;
  v_count := jsonb_array_length(p_items);
  if v_count = 0 then
    return '[]'::jsonb;
  end if;

  -- Check every item (nothing is written here). A refusal is re-raised naming
  -- its item.
  begin
    for i in 0 .. v_count - 1 loop
      v_at := i;
      v_args := {schema}.submit_item_args(p_items -> i);
      v_checked := {schema}.checked_submit_args(v_args.play, v_args.input,
                                                v_args.idempotency_key, v_args.runtime_api,
                                                v_args.max_attempts);
      v_lane := v_lanes -> coalesce(v_args.release_id, '');
      if v_lane is null then
        select jsonb_build_array(c.release_id, c.queue) into v_lane
          from {schema}.checked_release(v_args.release_id) c;
        v_lanes := v_lanes || jsonb_build_object(coalesce(v_args.release_id, ''), v_lane);
      end if;
      v_play[i + 1] := v_args.play;
      v_input[i + 1] := v_checked.input;
      v_own_release[i + 1] := v_lane ->> 0;
      v_queue[i + 1] := v_lane ->> 1;
      v_key[i + 1] := v_args.idempotency_key;
      v_api[i + 1] := v_checked.runtime_api;
      v_max[i + 1] := v_checked.max_attempts;
      v_own_run[i + 1] := gen_random_uuid();
    end loop;
  exception when others then
    get stacked diagnostics v_state = returned_sqlstate, v_message = message_text,
                            v_detail = pg_exception_detail, v_constraint = constraint_name;
    raise exception using errcode = v_state, message = format('item %s: %s', v_at, v_message),
                          detail = v_detail, constraint = v_constraint;
  end;

  -- Answer the keys, then write. Tried again when another transaction committed
  -- one of this call's keys meanwhile: the try is undone, and the keys answered
  -- again now that its run can be seen (as submit_run answers it).
  <<attempt>>
  for v_try in 1 .. 100 loop
    if v_try = 100 then  -- never seen: a key is answered on the next try
      raise exception 'submit_runs: this call''s idempotency keys kept being taken by other transactions; try again.'
        using errcode = '40001';
    end if;
    v_run := v_own_run;
    v_release := v_own_release;
    v_new := array_fill(true, array[v_count]);
    begin  -- reads only; a refusal names its item
      -- A key that names a run already: the item answers it (or is refused).
      for v_at in
        select u.n - 1 from unnest(v_key) with ordinality u(key, n)
         where exists (select 1 from {schema}.runs r where r.idempotency_key = u.key)
         order by u.n
      loop
        select * into v_row from {schema}.runs where idempotency_key = v_key[v_at + 1];
        perform {schema}.same_request(v_row, v_key[v_at + 1], v_play[v_at + 1],
                                      v_input[v_at + 1], v_queue[v_at + 1]);
        v_run[v_at + 1] := v_row.run_id;
        v_release[v_at + 1] := v_row.release_id;
        v_new[v_at + 1] := false;
      end loop;
      -- A key an earlier item of this call makes a run for: the item answers that
      -- run, held to the same request as a repeat of a stored run is.
      for v_at, v_first in
        select u.n - 1, u.first
          from (select u.n, min(u.n) over (partition by u.key) as first
                  from unnest(v_key) with ordinality u(key, n)
                 where u.key is not null) u
         where u.n > u.first and v_new[u.first]
         order by u.n
      loop
        v_row := null;
        v_row.run_id := v_run[v_first];
        v_row.play := v_play[v_first];
        v_row.input := v_input[v_first];
        v_row.release_id := v_release[v_first];
        v_row.queue := v_queue[v_first];
        perform {schema}.same_request(v_row, v_key[v_at + 1], v_play[v_at + 1],
                                      v_input[v_at + 1], v_queue[v_at + 1]);
        v_run[v_at + 1] := v_row.run_id;
        v_release[v_at + 1] := v_row.release_id;
        v_new[v_at + 1] := false;
      end loop;
    exception when others then
      get stacked diagnostics v_state = returned_sqlstate, v_message = message_text,
                              v_detail = pg_exception_detail, v_constraint = constraint_name;
      raise exception using errcode = v_state,
                            message = format('item %s: %s', v_at, v_message),
                            detail = v_detail, constraint = v_constraint;
    end;

    -- Not in an exception block: a queue made in one reads as not created here.
    perform {schema}.ensure_lane_queue(d.queue)
       from (select distinct u.queue from unnest(v_queue, v_new) u(queue, new)
              where u.new order by u.queue) d;
    begin
      -- The new runs' engine tasks first, a set per queue (engine contract
      -- spawn_v1: what spawn_run_task spawns, one statement for all of them),
      -- with its NOTIFYs; then every run row with its task id in one
      -- statement, in key order, so two calls that share keys wait for each
      -- other instead of deadlocking. A key committed meanwhile inserts no row:
      -- then this try is undone (its tasks, rows and NOTIFYs) and the keys are
      -- answered again.
      v_task := array_fill(null::uuid, array[v_count]);
      for v_spawn_queue in
        select distinct u.queue from unnest(v_queue, v_new) u(queue, new) where u.new
      loop
        select array_agg(t.task_id order by t.at) into v_task_set
          from lane_worker.spawn_tasks_v1(
                 v_spawn_queue, 'play-run',
                 array(select jsonb_build_object('runId', v_run[u.n]::text)
                         from unnest(v_queue, v_new) with ordinality u(queue, new, n)
                        where u.new and u.queue = v_spawn_queue order by u.n),
                 array(select v_max[u.n]
                         from unnest(v_queue, v_new) with ordinality u(queue, new, n)
                        where u.new and u.queue = v_spawn_queue order by u.n),
                 {schema}.play_run_retry_strategy()) t;
        select array_agg(u.n order by u.n) into v_spawned_at
          from unnest(v_queue, v_new) with ordinality u(queue, new, n)
         where u.new and u.queue = v_spawn_queue;
        for v_i in 1 .. cardinality(v_spawned_at) loop
          v_task[v_spawned_at[v_i]] := v_task_set[v_i];
        end loop;
        -- Each run's NOTIFY as spawn_run_task sends it (its payload the run id).
        perform pg_notify('lane_worker_' || v_spawn_queue, v_run[i]::text)
           from unnest(v_spawned_at) i;
      end loop;
      with spawned as materialized (
        select u.n, v_task[u.n] as task
          from unnest(v_new) with ordinality u(new, n)
         where u.new
      ), inserted as (
        insert into {schema}.runs (run_id, play, input, launch, release_id, queue,
                                   idempotency_key, max_attempts, task_id)
        select v_run[s.n], v_play[s.n], v_input[s.n],
               jsonb_build_object('absurdReleaseId', v_release[s.n], 'play', v_play[s.n],
                                  'runId', v_run[s.n]::text),
               v_release[s.n], v_queue[s.n], v_key[s.n], v_max[s.n], s.task
          from spawned s
         order by v_key[s.n] nulls last
        on conflict (idempotency_key) do nothing
        returning 1
      )
      select count(*) into v_made from inserted;
      if v_made = (select count(*) from unnest(v_new) u(new) where u.new) then
        exit attempt;
      end if;
      raise exception 'a key of this call was taken meanwhile' using errcode = 'LWK01';
    exception when sqlstate 'LWK01' then
      null;  -- undone: answer the keys again
    end;
  end loop;

  insert into {schema}.run_runtime_api (run_id, api)
  select v_run[u.n], v_api[u.n] from unnest(v_new) with ordinality u(new, n)
   where u.new and v_api[u.n] is not null;
  -- 0029: whether anything serves each queue of the call, asked once per queue;
  -- each result built once (a second pass over them cost a tenth of a bulk submit).
  select coalesce(jsonb_object_agg(d.queue, d.said ->> 'warning')
                    filter (where not (d.said ->> 'served')::boolean), '{}')
    into v_unserved
    from (select q.queue, {schema}.lane_served(q.queue, q.release_id) as said
            from (select distinct on (u.queue) u.queue, u.release_id  -- its first spelling
                    from unnest(v_queue, v_release) with ordinality u(queue, release_id, n)
                   order by u.queue, u.n) q) d;
  return (select jsonb_agg(
                   case when v_unserved ? v_queue[u.n]
                        then jsonb_build_object('runId', v_run[u.n], 'queue', v_queue[u.n],
                                                'releaseId', v_release[u.n], 'created', u.new,
                                                'served', false,
                                                'warning', v_unserved ->> v_queue[u.n])
                        else jsonb_build_object('runId', v_run[u.n], 'queue', v_queue[u.n],
                                                'releaseId', v_release[u.n], 'created', u.new,
                                                'served', true) end
                   order by u.n)
            from unnest(v_new) with ordinality u(new, n));
end;
$$;
