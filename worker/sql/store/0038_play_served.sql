-- A submit says when the lane is served but none of its live workers registers
-- the play (issue 31 §2 of lane-worker): a mistyped play name, or a worker of an
-- older app build, used to queue a run that waited for ever with no word.
--
-- submit_run and submit_runs still accept the run (a worker whose app registers
-- it may start later: nothing is lost) and, when the lane is served (0029's
-- lane_served) and its live workers register plays but none of them this one,
-- add `playServed: false` and a `warning` naming the plays they do register.
-- `served` keeps 0029's meaning (something serves the lane). A lane with no live
-- worker (served by its row or its deploy), or whose live workers name no play,
-- says nothing of the play: its workers are not there to ask. Every other field
-- is unchanged.
--
-- The check is one indexed read (workers_queue_live_idx, 0003) made only when the
-- lane is served. submit_run and submit_runs are 0029's, redefined here (same
-- signatures); every line changed is marked `0038`.

-- The plays the live workers of lane p_queue register (sorted, each once); null
-- when none of its workers is live or none of them says any play (a row that
-- names none tells nothing of what it runs): then nothing is said of the play.
create or replace function {schema}.lane_live_plays(p_queue text)
  returns text[]
  language sql
  stable
as $$
  select array_agg(distinct p.play order by p.play)
    from {schema}.workers w
    cross join lateral unnest(w.plays) as p(play)
   where w.queue = p_queue and {schema}.worker_live(w.heartbeat_at, w.stopped_at)
$$;

-- {} when play p_play may run on lane p_queue as far as its live workers tell
-- (p_live: lane_live_plays as a JSON array; null: none is live), else
-- {"playServed": false, "warning": ...}.
create or replace function {schema}.play_warning(p_queue text, p_play text, p_live jsonb)
  returns jsonb
  language sql
  immutable
as $$
  select case
    when p_live is null or jsonb_typeof(p_live) <> 'array' or p_live ? p_play then '{}'::jsonb
    else jsonb_build_object('playServed', false, 'warning', format(
      'no live worker of lane %s registers play %s (they register %s): the run waits there until a worker whose app registers it starts; check the play''s name and the app the lane''s workers load.',
      p_queue, quote_literal(left(p_play, 200)),
      case when jsonb_array_length(p_live) <= 20
             then (select string_agg(e, ', ' order by n)
                     from jsonb_array_elements_text(p_live) with ordinality x(e, n))
           else (select string_agg(e, ', ' order by n)
                   from jsonb_array_elements_text(p_live) with ordinality x(e, n)
                  where n <= 20)
                || format(' and %s more', jsonb_array_length(p_live) - 20) end))
  end
$$;

-- lane_served's answer for lane p_queue (release p_release_id), and when it is
-- served, play_warning's for play p_play: what a single submit says.
create or replace function {schema}.lane_serves_play(
  p_queue text, p_release_id text, p_play text)
  returns jsonb
  language plpgsql
  stable
as $$
declare
  v_said jsonb := {schema}.lane_served(p_queue, p_release_id);
begin
  if not (v_said ->> 'served')::boolean then
    return v_said;
  end if;
  return v_said || {schema}.play_warning(p_queue, p_play,
                                         to_jsonb({schema}.lane_live_plays(p_queue)));
end;
$$;

-- 0029's submit_run, each answer with lane_serves_play's fields (the lines marked 0038).
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
             || {schema}.lane_serves_play(v_row.queue, v_row.release_id, v_row.play);  -- 0038
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
           || {schema}.lane_serves_play(v_row.queue, v_row.release_id, v_row.play);  -- 0038
  end if;
  if v_checked.runtime_api is not null then
    insert into {schema}.run_runtime_api (run_id, api) values (v_run, v_checked.runtime_api);
  end if;
  perform {schema}.spawn_run_task(v_run, v_lane.queue, v_checked.max_attempts);
  return jsonb_build_object('runId', v_run, 'queue', v_lane.queue,
                            'releaseId', v_lane.release_id, 'created', true)
         || {schema}.lane_serves_play(v_lane.queue, v_lane.release_id, p_play);  -- 0038
end;
$$;

-- 0029's submit_runs, each served result with the play's check too (the lines
-- marked 0038).
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
  v_live jsonb;  -- 0038: served queue -> its live workers' plays (null: none live)
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
  -- 0038: and, for each served queue, the plays its live workers register (null:
  -- none is live, so nothing is said of the play), asked once per queue too.
  select coalesce(jsonb_object_agg(d.queue, d.said ->> 'warning')
                    filter (where not (d.said ->> 'served')::boolean), '{}'),
         coalesce(jsonb_object_agg(d.queue, to_jsonb({schema}.lane_live_plays(d.queue)))
                    filter (where (d.said ->> 'served')::boolean), '{}')  -- 0038
    into v_unserved, v_live  -- 0038
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
                                                'served', true)
                             || {schema}.play_warning(  -- 0038
                                  v_queue[u.n], v_play[u.n], v_live -> v_queue[u.n])
                        end
                   order by u.n)
            from unnest(v_new) with ordinality u(new, n));
end;
$$;
