-- Bulk submit (issue 30, item 10): submit_runs(jsonb) takes a JSON array of
-- submits and makes them in one transaction, all or none.
--
-- submit_run's checks move into checked_submit, which both call, so an item is
-- checked exactly as a submit_run call is (same limits, SQLSTATEs, messages).
-- submit_run is redefined here only to call it: same signature, same checks in
-- the same order, same writes, same result (test_db_api.py holds it to that).
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
-- Set-based where it pays: the store's rows are written by one statement each
-- for the whole call. The engine task of each run is still one
-- absurd.spawn_task call per run (through spawn_run_task, which keeps the task
-- name, retry policy and NOTIFY in one place): the engine has no bulk spawn,
-- and writing its tables directly would bind the store to the engine's table
-- layout. That call is most of a bulk submit's time (bench/submit.py).

-- The checks of a submit: refuse (22023) what submit_run refuses, return the
-- values it writes (input null is {}, max attempts null is 5, the runtime API
-- context without nulls, the release id trimmed, and the release's queue).
create or replace function {schema}.checked_submit(
  p_play text, p_input jsonb, p_release_id text, p_idempotency_key text,
  p_runtime_api jsonb, p_max_attempts integer,
  out input jsonb, out max_attempts integer, out runtime_api jsonb,
  out release_id text, out queue text)
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

-- 0008's submit_run, its checks now checked_submit's (the rest unchanged).
create or replace function {schema}.submit_run(
  p_play text, p_input jsonb, p_release_id text,
  p_idempotency_key text default null, p_runtime_api jsonb default null,
  p_max_attempts integer default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_checked record;
  v_row {schema}.runs;
  v_run uuid := gen_random_uuid();
  v_inserted uuid;
begin
  v_checked := {schema}.checked_submit(p_play, p_input, p_release_id, p_idempotency_key,
                                       p_runtime_api, p_max_attempts);
  if p_idempotency_key is not null then
    -- A repeat is answered before anything is made for it (such as the queue
    -- of a lane the first run never used).
    select * into v_row from {schema}.runs where idempotency_key = p_idempotency_key;
    if found then
      return {schema}.same_request(v_row, p_idempotency_key, p_play, v_checked.input,
                                   v_checked.queue);
    end if;
  end if;
  perform {schema}.ensure_lane_queue(v_checked.queue);
  insert into {schema}.runs (run_id, play, input, launch, release_id, queue, idempotency_key,
                             max_attempts)
  values (v_run, p_play, v_checked.input,
          jsonb_build_object('absurdReleaseId', v_checked.release_id, 'play', p_play,
                             'runId', v_run::text),
          v_checked.release_id, v_checked.queue, p_idempotency_key, v_checked.max_attempts)
  on conflict (idempotency_key) do nothing
  returning run_id into v_inserted;
  if v_inserted is null then  -- the same key committed meanwhile
    select * into v_row from {schema}.runs where idempotency_key = p_idempotency_key;
    return {schema}.same_request(v_row, p_idempotency_key, p_play, v_checked.input,
                                 v_checked.queue);
  end if;
  if v_checked.runtime_api is not null then
    insert into {schema}.run_runtime_api (run_id, api) values (v_run, v_checked.runtime_api);
  end if;
  perform {schema}.spawn_run_task(v_run, v_checked.queue, v_checked.max_attempts);
  return jsonb_build_object('runId', v_run, 'queue', v_checked.queue,
                            'releaseId', v_checked.release_id, 'created', true);
end;
$$;

-- One item of submit_runs as submit_run's arguments: refuse (22023) an item that
-- is not a JSON object, an unknown field, or a field of the wrong JSON type.
-- What the values may be is checked_submit's.
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
  v_row {schema}.runs;
  v_state text;
  v_message text;
  v_detail text;
  v_constraint text;
  -- One slot per item (index + 1): what submit_run's arguments and checks came to.
  v_play text[] := '{}';
  v_input jsonb[] := '{}';
  v_release text[] := '{}';
  v_queue text[] := '{}';
  v_key text[] := '{}';
  v_api jsonb[] := '{}';
  v_max integer[] := '{}';
  v_run uuid[] := '{}';  -- the run each item answers with
  v_new boolean[] := '{}';  -- the item makes its run (not a repeat of a key)
  v_created uuid[];
  v_result jsonb;
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

  -- Check every item, then answer every repeated key, before anything is written
  -- (this block writes nothing: a queue made in it would read as not created
  -- here, ensure_lane_queue). A refusal is re-raised naming its item.
  begin
    for i in 0 .. v_count - 1 loop
      v_at := i;
      v_args := {schema}.submit_item_args(p_items -> i);
      v_checked := {schema}.checked_submit(v_args.play, v_args.input, v_args.release_id,
                                           v_args.idempotency_key, v_args.runtime_api,
                                           v_args.max_attempts);
      v_play[i + 1] := v_args.play;
      v_input[i + 1] := v_checked.input;
      v_release[i + 1] := v_checked.release_id;
      v_queue[i + 1] := v_checked.queue;
      v_key[i + 1] := v_args.idempotency_key;
      v_api[i + 1] := v_checked.runtime_api;
      v_max[i + 1] := v_checked.max_attempts;
      v_run[i + 1] := gen_random_uuid();
      v_new[i + 1] := true;
    end loop;
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
    raise exception using errcode = v_state, message = format('item %s: %s', v_at, v_message),
                          detail = v_detail, constraint = v_constraint;
  end;

  -- Writes: outside any exception block (ensure_lane_queue, above).
  perform {schema}.ensure_lane_queue(q)
     from (select distinct q from unnest(v_queue, v_new) u(q, new) where new order by q) d;
  -- In key order, so two calls that share keys wait for each other instead of
  -- deadlocking.
  with inserted as (
    insert into {schema}.runs (run_id, play, input, launch, release_id, queue,
                               idempotency_key, max_attempts)
    select u.run, u.play, u.input,
           jsonb_build_object('absurdReleaseId', u.release, 'play', u.play,
                              'runId', u.run::text),
           u.release, u.queue, u.key, u.max
      from unnest(v_run, v_play, v_input, v_release, v_queue, v_key, v_max, v_new)
             u(run, play, input, release, queue, key, max, new)
     where u.new
     order by u.key nulls last
    on conflict (idempotency_key) do nothing
    returning run_id
  )
  select coalesce(array_agg(run_id), '{}') into v_created from inserted;

  if cardinality(v_created) < (select count(*) from unnest(v_new) n where n) then
    -- A key another transaction committed meanwhile: answer its run, as
    -- submit_run does (a refusal still names its item).
    for v_at in
      select u.n - 1 from unnest(v_run, v_new) with ordinality u(run, new, n)
       where u.new and u.run <> all(v_created) order by u.n
    loop
      select * into v_row from {schema}.runs where idempotency_key = v_key[v_at + 1];
      begin
        perform {schema}.same_request(v_row, v_key[v_at + 1], v_play[v_at + 1],
                                          v_input[v_at + 1], v_queue[v_at + 1]);
      exception when others then
        get stacked diagnostics v_state = returned_sqlstate, v_message = message_text,
                                v_detail = pg_exception_detail, v_constraint = constraint_name;
        raise exception using errcode = v_state,
                              message = format('item %s: %s', v_at, v_message),
                              detail = v_detail, constraint = v_constraint;
      end;
      v_new[v_at + 1] := false;
      -- Its later repeats in this call answered the run this call meant to make.
      for i in v_at + 1 .. v_count - 1 loop
        if v_run[i + 1] = v_run[v_at + 1] then
          v_run[i + 1] := v_row.run_id;
          v_release[i + 1] := v_row.release_id;
        end if;
      end loop;
      v_run[v_at + 1] := v_row.run_id;
      v_release[v_at + 1] := v_row.release_id;
    end loop;
  end if;

  insert into {schema}.run_runtime_api (run_id, api)
  select u.run, u.api from unnest(v_run, v_api, v_new) u(run, api, new)
   where u.new and u.api is not null;
  perform {schema}.spawn_run_task(u.run, u.queue, u.max)
     from unnest(v_run, v_queue, v_max, v_new) with ordinality u(run, queue, max, new, n)
    where u.new
    order by u.n;

  select jsonb_agg(jsonb_build_object('runId', u.run, 'queue', u.queue, 'releaseId', u.release,
                                      'created', u.new)
                   order by u.n)
    into v_result
    from unnest(v_run, v_queue, v_release, v_new) with ordinality u(run, queue, release, new, n);
  return v_result;
end;
$$;
