-- Bulk submit (issue 30, item 10): submit_runs(jsonb) takes a JSON array of
-- submits and makes them in one transaction, all or none.
--
-- submit_run's checks move into checked_submit_args and checked_release, which
-- both functions call, so an item is checked exactly as a submit_run call is
-- (same limits, order, SQLSTATEs, messages). submit_run is redefined here only
-- to call them: same signature, same checks, same writes, same result.
--
-- An item is a JSON object of submit_run's arguments by their JSON names:
-- play, input, releaseId, idempotencyKey, runtimeApi, maxAttempts (a missing
-- field or JSON null is submit_run's null). A refusal names its item's index,
-- 0-based ("item 3: ..."), with the SQLSTATE (and constraint, DETAIL) submit_run
-- would have raised; nothing is written. Items are checked in order, then the
-- idempotency keys in item order: the first refusal found is the one raised.
-- Two items of one call with the same idempotency key: the second answers the
-- first's run (created false) as a second submit_run would, and is refused
-- (23505) when it asks for something else.
--
-- Set-based where it pays: each release's lane is worked out once a call, the
-- engine tasks are spawned as one set per queue (engine contract spawn_v1, held
-- to absurd.spawn_task by tests/integration/test_spawn_sets.py: one spawn_task
-- call per run was most of a bulk submit's time, bench/submit.py), and the
-- store's rows are written by one statement for the whole call, with their
-- task ids (no second write of each row).

-- The checks of a submit's arguments but its release, in submit_run's order:
-- refuse (22023) what submit_run refuses; return the values it writes (input
-- null is {}, max attempts null is 5, the runtime API context without nulls).
create or replace function {schema}.checked_submit_args(
  p_play text, p_input jsonb, p_idempotency_key text, p_runtime_api jsonb,
  p_max_attempts integer,
  out input jsonb, out max_attempts integer, out runtime_api jsonb)
  language plpgsql
  immutable
as $$
begin
  input := coalesce(p_input, '{}'::jsonb);
  max_attempts := coalesce(p_max_attempts, 5);
  if p_play is null or {schema}.lane_trim(p_play) = '' then
    raise exception 'submit needs a play name (a non-blank string).' using errcode = '22023';
  end if;
  if char_length(p_play) > 200 then
    raise exception 'play name % is not usable: a play name has at most 200 characters and no NUL or unpaired surrogate character.',
      quote_literal(left(p_play, 100)) || '...'
      using errcode = '22023';
  end if;
  if jsonb_typeof(input) <> 'object' then
    raise exception 'a run''s input must be a JSON object, not a JSON %: wrap it, for example {"value": ...}.',
      jsonb_typeof(input)
      using errcode = '22023';
  end if;
  perform {schema}.checked_size(input, 'the run''s input');
  perform {schema}.checked_key(p_idempotency_key, 'an idempotency key');
  if max_attempts not between 1 and 1000 then
    raise exception 'max attempts must be between 1 and 1000, got %.', max_attempts
      using errcode = '22023';
  end if;
  runtime_api := {schema}.checked_runtime_api(p_runtime_api);
end;
$$;

-- A submit's release, checked last as submit_run does: the release id trimmed,
-- and its lane's queue (22023 for one no worker can serve or that names no queue).
create or replace function {schema}.checked_release(
  p_release_id text, out release_id text, out queue text)
  language plpgsql
  immutable
as $$
begin
  release_id := {schema}.lane_trim(coalesce(p_release_id, ''));
  if char_length(release_id) > 200 then
    -- The boot guard's limit: no worker could serve a longer one.
    raise exception 'release id % is over 200 characters: no worker can serve its lane.',
      quote_literal(left(release_id, 100)) || '...'
      using errcode = '22023';
  end if;
  queue := {schema}.queue_for_release(release_id);
end;
$$;

-- 0008's submit_run, its checks now the two functions above (the rest unchanged).
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
                                   v_lane.queue);
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
                                 v_lane.queue);
  end if;
  if v_checked.runtime_api is not null then
    insert into {schema}.run_runtime_api (run_id, api) values (v_run, v_checked.runtime_api);
  end if;
  perform {schema}.spawn_run_task(v_run, v_lane.queue, v_checked.max_attempts);
  return jsonb_build_object('runId', v_run, 'queue', v_lane.queue,
                            'releaseId', v_lane.release_id, 'created', true);
end;
$$;

-- One item of submit_runs as submit_run's arguments: refuse (22023) an item that
-- is not a JSON object, an unknown field, or a field of the wrong JSON type.
-- What the values may be is checked_submit_args' and checked_release's.
create or replace function {schema}.submit_item_args(
  p_item jsonb,
  out play text, out input jsonb, out release_id text, out idempotency_key text,
  out runtime_api jsonb, out max_attempts integer)
  language plpgsql
  immutable
as $$
declare
  v_field text;
  v_number numeric;
begin
  if jsonb_typeof(p_item) is distinct from 'object' then
    raise exception 'a submit is a JSON object (play, input, releaseId, idempotencyKey, runtimeApi, maxAttempts), not a JSON %.',
      coalesce(jsonb_typeof(p_item), 'null')
      using errcode = '22023';
  end if;
  for v_field in select jsonb_object_keys(p_item) loop
    if v_field not in ('play', 'input', 'releaseId', 'idempotencyKey', 'runtimeApi',
                       'maxAttempts') then
      raise exception 'a submit has no field %: it takes play, input, releaseId, idempotencyKey, runtimeApi and maxAttempts.',
        quote_literal(left(v_field, 100))
        using errcode = '22023';
    end if;
    if v_field in ('play', 'releaseId', 'idempotencyKey')
       and jsonb_typeof(p_item -> v_field) not in ('string', 'null') then
      raise exception 'a submit''s % must be a JSON string, not a JSON %.',
        v_field, jsonb_typeof(p_item -> v_field)
        using errcode = '22023';
    end if;
  end loop;
  play := p_item ->> 'play';
  input := nullif(p_item -> 'input', 'null'::jsonb);
  release_id := p_item ->> 'releaseId';
  idempotency_key := p_item ->> 'idempotencyKey';
  runtime_api := p_item -> 'runtimeApi';
  if jsonb_typeof(p_item -> 'maxAttempts') = 'number' then
    v_number := (p_item ->> 'maxAttempts')::numeric;
    if v_number <> trunc(v_number) then
      raise exception 'a submit''s maxAttempts must be a whole number, got %.', v_number
        using errcode = '22023';
    end if;
    if v_number not between -2147483648 and 2147483647 then
      raise exception 'a submit''s maxAttempts must be between 1 and 1000, got %.', v_number
        using errcode = '22023';
    end if;
    max_attempts := v_number::integer;
  elsif jsonb_typeof(p_item -> 'maxAttempts') <> 'null' then
    raise exception 'a submit''s maxAttempts must be a whole number, not a JSON %.',
      jsonb_typeof(p_item -> 'maxAttempts')
      using errcode = '22023';
  end if;
end;
$$;


-- Submit every item of p_items (a JSON array of submit objects, above) in this
-- one transaction; return a JSON array of submit_run's results, one per item in
-- order. An empty array submits nothing and returns [].
-- The retry strategy of every play-run task: spawn_run_task's (0008), written
-- out there too, always a delay > 0 (every retry is a sleeping run, which the
-- continuation fence defers and never adopts).
create or replace function {schema}.play_run_retry_strategy()
  returns jsonb
  language sql
  immutable
as $$
  select jsonb_build_object('kind', 'exponential', 'base_seconds', 1, 'factor', 2,
                            'max_seconds', 300)
$$;

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
  return (select jsonb_agg(jsonb_build_object('runId', v_run[u.n], 'queue', v_queue[u.n],
                                              'releaseId', v_release[u.n], 'created', u.new)
                           order by u.n)
            from unnest(v_new) with ordinality u(new, n));
end;
$$;
