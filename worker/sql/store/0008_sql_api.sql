-- The app's way in: submit_run, signal_run, cancel_run and run_status, callable
-- from any language over a plain Postgres connection, each one transaction.
-- `LaneClient` and the CLI call these same functions, so each rule (the lane a
-- release drains, idempotency, the signal chain of a retried run, the cancel
-- and its fact) has one implementation. Bad input raises before anything is
-- written, with these SQLSTATEs:
--   22023 (invalid_parameter_value)  the request is unusable; the message says why
--   23505 (unique_violation)         an idempotency key already names another
--                                    request (constraint `idempotency_key`,
--                                    DETAIL the run id it names)
--   P0002 (no_data_found)            no such run
-- Limits are worker/limits.py's: a play name 1..200 characters, a key 1..255,
-- an input a JSON object and an event payload any JSON value, each at most
-- 1 MiB as Postgres prints it (`jsonb::text`).

-- -- The lane rules (worker/lanes.py, byte for byte) -------------------------

-- Python's str.strip(): the whitespace both sides trim, which is Unicode's.
create or replace function {schema}.lane_trim(p_value text)
  returns text
  language sql
  immutable
as $$
  select regexp_replace(
           p_value,
           format('^[%1$s]+|[%1$s]+$',
                  E' \\t\\n\\r\\x0b\\x0c' || chr(28) || chr(29) || chr(30) || chr(31)
                  || chr(133) || chr(160) || chr(5760)
                  || (select string_agg(chr(c), '') from generate_series(8192, 8202) c)
                  || chr(8232) || chr(8233) || chr(8239) || chr(8287) || chr(12288)),
           '', 'g')
$$;

-- Lowercase, fold every run outside [a-z0-9_] into one '_', trim '_' at both
-- ends. Only ASCII survives the fold, so lowering ASCII is enough, plus the
-- two letters whose Unicode lowercase holds an ASCII letter (U+0130 lowers to
-- 'i' and a combining dot, U+212A KELVIN SIGN to 'k'). The class is spelled
-- out: a regex range may follow the collation.
create or replace function {schema}.lane_collapse(p_value text)
  returns text
  language sql
  immutable
as $$
  select btrim(
           regexp_replace(
             translate(replace(p_value, chr(304), 'i' || chr(775)),
                       'ABCDEFGHIJKLMNOPQRSTUVWXYZ' || chr(8490),
                       'abcdefghijklmnopqrstuvwxyzk'),
             '[^abcdefghijklmnopqrstuvwxyz0123456789_]+', '_', 'g'),
           '_')
$$;

-- The one queue a release's runs ride: `runs` for `dev`, `runs_<suffix>` for
-- `dev-<suffix>` (suffix folded, 32 characters), else `runs_<segment>` where an
-- overlong segment keeps a 31-character head and an 8-character sha256 tail.
create or replace function {schema}.queue_for_release(p_release_id text)
  returns text
  language plpgsql
  immutable
as $$
declare
  v_release text := {schema}.lane_trim(coalesce(p_release_id, ''));
  v_segment text;
begin
  if v_release = '' then
    raise exception 'a release lane needs a non-empty release id.'
      using errcode = '22023';
  end if;
  if v_release = 'dev' then
    return 'runs';
  end if;
  if left(v_release, 4) = 'dev-' then
    v_segment := left({schema}.lane_collapse(substr(v_release, 5)), 32);
    return case when v_segment = '' then 'runs' else 'runs_' || v_segment end;
  end if;
  v_segment := {schema}.lane_collapse(v_release);
  if char_length(v_segment) > 40 then
    v_segment := rtrim(left(v_segment, 31), '_') || '_'
                 || left(encode(sha256(convert_to(v_segment, 'UTF8')), 'hex'), 8);
  end if;
  if v_segment = '' then
    raise exception 'release id % has no letter, digit or underscore, so it names no queue.',
      quote_literal(left(v_release, 100))
      using errcode = '22023';
  end if;
  return 'runs_' || v_segment;
end;
$$;

-- -- Checks shared by the functions below -------------------------------------

create or replace function {schema}.checked_key(p_key text, p_what text)
  returns text
  language plpgsql
  immutable
as $$
begin
  if p_key is null then
    return null;
  end if;
  if {schema}.lane_trim(p_key) = '' then
    raise exception '% must be a non-blank string.', p_what using errcode = '22023';
  end if;
  if char_length(p_key) > 255 then
    raise exception '% % is not usable: a key has at most 255 characters and no NUL or unpaired surrogate character.',
      p_what, quote_literal(left(p_key, 100)) || '...'
      using errcode = '22023';
  end if;
  return p_key;
end;
$$;

create or replace function {schema}.checked_size(p_value jsonb, p_what text)
  returns jsonb
  language plpgsql
  immutable
as $$
declare
  v_size integer := octet_length(p_value::text);
begin
  if v_size > 1048576 then
    raise exception '% is % bytes of JSON, more than the 1048576 bytes (1 MiB) allowed: store large data elsewhere and pass a reference to it.',
      p_what, v_size
      using errcode = '22023';
  end if;
  return p_value;
end;
$$;

-- The runtime API a run's ledger facts are delivered to (the seed's
-- absurdRuntimeApiFromLaunch): `baseUrl` (http or https) and `executorToken`
-- are required, `integrationMode`, `vercelProtectionBypassToken` and
-- `runtimeTestFaultHeader` optional; nothing else. No message quotes a value:
-- two of them are secrets.
create or replace function {schema}.checked_runtime_api(p_api jsonb)
  returns jsonb
  language plpgsql
  immutable
as $$
declare
  v_key text;
  v_url text;
  v_port text;
begin
  if p_api is null or jsonb_typeof(p_api) = 'null' then
    return null;
  end if;
  if jsonb_typeof(p_api) <> 'object' then
    raise exception 'the runtime API context must be a JSON object with baseUrl and executorToken, not a JSON %.',
      jsonb_typeof(p_api)
      using errcode = '22023';
  end if;
  for v_key in select jsonb_object_keys(p_api) loop
    if v_key not in ('baseUrl', 'executorToken', 'integrationMode',
                     'vercelProtectionBypassToken', 'runtimeTestFaultHeader') then
      raise exception 'the runtime API context has an unknown field %: it takes baseUrl, executorToken, integrationMode, vercelProtectionBypassToken and runtimeTestFaultHeader.',
        quote_literal(left(v_key, 100))
        using errcode = '22023';
    end if;
    if jsonb_typeof(p_api -> v_key) not in ('string', 'null') then
      raise exception 'the runtime API context''s % must be a string.', v_key
        using errcode = '22023';
    end if;
  end loop;
  -- A URL the relay can always send to: a scheme, a host (DNS labels or an IPv4
  -- address; no user or password in it), an optional port, an optional path.
  v_url := coalesce(p_api ->> 'baseUrl', '');
  v_port := substring(v_url from '^https?://[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*:([0-9]{1,5})(?:[/?#]|$)');
  if v_url !~ '^https?://[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~!$&''()*+,;=:@%/-]*)?$'
     or (v_port is not null and v_port::integer not between 1 and 65535) then
    raise exception 'the runtime API context''s baseUrl must be an http:// or https:// URL: a host name or address, an optional port (1..65535) and path, no user or password, query or fragment.'
      using errcode = '22023';
  end if;
  -- Header values: no control characters (they could not be sent).
  if exists (select 1 from jsonb_each_text(p_api) e
              where e.value ~ '[\x01-\x1f\x7f]') then
    raise exception 'the runtime API context holds a control character (a line break, a tab ...), which no HTTP header can carry.'
      using errcode = '22023';
  end if;
  if {schema}.lane_trim(coalesce(p_api ->> 'executorToken', '')) = '' then
    raise exception 'the runtime API context needs an executorToken (a non-blank string).'
      using errcode = '22023';
  end if;
  if char_length(p_api::text) > 8192 then
    raise exception 'the runtime API context is over 8192 characters.' using errcode = '22023';
  end if;
  return jsonb_strip_nulls(p_api);
end;
$$;

-- Where a run's ledger facts go; read only by the delivery relay. Its own table
-- so that no query that shows a run (status, runs, the page, run_status) can
-- carry the tokens.
create table if not exists {schema}.run_runtime_api (
  run_id uuid primary key references {schema}.runs (run_id) on delete cascade,
  api jsonb not null,
  created_at timestamptz not null default now()
);

-- -- The engine task a run rides, and its lane's queue ------------------------

-- Make lane queue p_queue ready (idempotent; serialized per queue, so two
-- first submits to a new lane do not race the engine's DDL). The cleanup
-- policy is worker/db/engine.py's QUEUE_CLEANUP_TTL / _LIMIT.
create or replace function {schema}.ensure_lane_queue(p_queue text)
  returns void
  language plpgsql
as $$
begin
  if exists (select 1 from absurd.queues where queue_name = p_queue) then
    return;
  end if;
  perform pg_advisory_xact_lock(hashtext('lane_worker.queue'), hashtext(p_queue));
  if not exists (select 1 from absurd.queues where queue_name = p_queue) then
    perform absurd.create_queue(p_queue);
    perform absurd.set_queue_policy(
      p_queue, jsonb_build_object('cleanup_ttl', '6 hours', 'cleanup_limit', 1000));
  end if;
end;
$$;

-- Spawn the engine task of run p_run_id (its store row written in this
-- transaction) and wake its lane when the transaction commits. The task name,
-- retry policy and NOTIFY channel are worker/db/tasks.py's.
create or replace function {schema}.spawn_run_task(p_run_id uuid, p_queue text, p_max_attempts integer)
  returns uuid
  language plpgsql
as $$
declare
  v_task uuid;
begin
  select s.task_id into v_task
    from absurd.spawn_task(
           p_queue, 'play-run', jsonb_build_object('runId', p_run_id::text),
           jsonb_build_object(
             'max_attempts', p_max_attempts,
             -- always a delay > 0: every retry is a sleeping run, which the
             -- continuation fence defers and never adopts
             'retry_strategy', jsonb_build_object('kind', 'exponential', 'base_seconds', 1,
                                                  'factor', 2, 'max_seconds', 300))) s;
  update {schema}.runs set task_id = v_task, updated_at = now() where run_id = p_run_id;
  perform pg_notify('lane_worker_' || p_queue, p_run_id::text);
  return v_task;
end;
$$;

-- Move run p_run_id to terminal status p_status and append its one terminal
-- fact (p_fact_type, p_fact), fenced by attempt p_fence unless that is null
-- (cancel, an operator, the reconciler), never over another terminal status.
-- Its other attempts that recorded no end are closed as lost leases: all of
-- them when its current attempt settles it; when settled from outside, only
-- those whose worker is gone (a live worker's attempt may still be inside a
-- step, and ends itself at its next engine call). p_own_attempt: an unfenced
-- caller's own attempt (a deferral's put-back), which it ends itself. Returns
-- the run id, or null when nothing was settled.
create or replace function {schema}.settle_run(
  p_run_id uuid, p_fence bigint, p_status text, p_output jsonb, p_error jsonb,
  p_fact_type text, p_fact jsonb, p_own_attempt bigint)
  returns uuid
  language plpgsql
as $$
declare
  v_settled uuid;
begin
  update {schema}.runs
     set status = p_status, output = p_output, error = p_error, current_wait = null,
         finished_at = now(), updated_at = now()
   where run_id = p_run_id
     and (p_fence is null or current_attempt_id = p_fence)
     and status not in ('completed', 'failed', 'cancelled')
  returning run_id into v_settled;
  if v_settled is null then
    return null;
  end if;
  insert into {schema}.ledger (run_id, type, fact)
  values (v_settled, p_fact_type, p_fact)
  on conflict (run_id) where type in ('run.completed', 'run.failed', 'run.cancelled') do nothing;
  update {schema}.attempts a
     set outcome = 'lease_lost', finished_at = now(),
         error = coalesce(a.error, jsonb_build_object(
           'reason', 'the run ended without this attempt'))
   where a.run_id = v_settled and a.outcome is null
     and a.attempt_id is distinct from p_fence
     and a.attempt_id is distinct from p_own_attempt
     and (p_fence is not null or not {schema}.attempt_worker_live(a.worker_id));
  return v_settled;
end;
$$;

-- -- The API --------------------------------------------------------------------

-- Refuse a repeat of an idempotency key that asks for something else than the
-- run it names (its play, its input as jsonb compares, or its lane).
create or replace function {schema}.same_request(
  p_row {schema}.runs, p_key text, p_play text, p_input jsonb, p_queue text)
  returns jsonb
  language plpgsql
as $$
declare
  v_differs text[] := '{}';
begin
  if p_row.play <> p_play then v_differs := v_differs || 'play'::text; end if;
  if p_row.input <> p_input then v_differs := v_differs || 'input'::text; end if;
  if p_row.queue <> p_queue then v_differs := v_differs || 'lane'::text; end if;
  if cardinality(v_differs) > 0 then
    raise exception 'idempotency key % already names run % (play %, lane %), and this submit differs in its %; use another key for another request.',
      quote_literal(p_key), p_row.run_id, quote_literal(p_row.play), p_row.queue,
      array_to_string(v_differs, ' and ')
      using errcode = '23505', constraint = 'idempotency_key', detail = p_row.run_id::text;
  end if;
  return jsonb_build_object('runId', p_row.run_id, 'queue', p_row.queue,
                            'releaseId', p_row.release_id, 'created', false);
end;
$$;

-- Submit a run of p_play with input p_input (a JSON object; null is {}) on the
-- lane of release p_release_id. A repeat of p_idempotency_key returns the run
-- it names (created false) and writes nothing. p_runtime_api: where the run's
-- ledger facts are delivered. p_max_attempts: the engine's attempts (null: 5,
-- the LANE_WORKER_MAX_ATTEMPTS default).
create or replace function {schema}.submit_run(
  p_play text, p_input jsonb, p_release_id text,
  p_idempotency_key text default null, p_runtime_api jsonb default null,
  p_max_attempts integer default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_input jsonb := coalesce(p_input, '{}'::jsonb);
  v_max integer := coalesce(p_max_attempts, 5);
  v_api jsonb;
  v_release text;
  v_queue text;
  v_row {schema}.runs;
  v_run uuid := gen_random_uuid();
  v_inserted uuid;
begin
  if p_play is null or {schema}.lane_trim(p_play) = '' then
    raise exception 'submit needs a play name (a non-blank string).' using errcode = '22023';
  end if;
  if char_length(p_play) > 200 then
    raise exception 'play name % is not usable: a play name has at most 200 characters and no NUL or unpaired surrogate character.',
      quote_literal(left(p_play, 100)) || '...'
      using errcode = '22023';
  end if;
  if jsonb_typeof(v_input) <> 'object' then
    raise exception 'a run''s input must be a JSON object, not a JSON %: wrap it, for example {"value": ...}.',
      jsonb_typeof(v_input)
      using errcode = '22023';
  end if;
  perform {schema}.checked_size(v_input, 'the run''s input');
  perform {schema}.checked_key(p_idempotency_key, 'an idempotency key');
  if v_max not between 1 and 1000 then
    raise exception 'max attempts must be between 1 and 1000, got %.', v_max using errcode = '22023';
  end if;
  v_api := {schema}.checked_runtime_api(p_runtime_api);
  v_release := {schema}.lane_trim(coalesce(p_release_id, ''));
  if char_length(v_release) > 200 then
    -- The boot guard's limit: no worker could serve a longer one.
    raise exception 'release id % is over 200 characters: no worker can serve its lane.',
      quote_literal(left(v_release, 100)) || '...'
      using errcode = '22023';
  end if;
  v_queue := {schema}.queue_for_release(v_release);

  if p_idempotency_key is not null then
    -- A repeat is answered before anything is made for it (such as the queue
    -- of a lane the first run never used).
    select * into v_row from {schema}.runs where idempotency_key = p_idempotency_key;
    if found then
      return {schema}.same_request(v_row, p_idempotency_key, p_play, v_input, v_queue);
    end if;
  end if;
  perform {schema}.ensure_lane_queue(v_queue);
  insert into {schema}.runs (run_id, play, input, launch, release_id, queue, idempotency_key,
                             max_attempts)
  values (v_run, p_play, v_input,
          jsonb_build_object('absurdReleaseId', v_release, 'play', p_play, 'runId', v_run::text),
          v_release, v_queue, p_idempotency_key, v_max)
  on conflict (idempotency_key) do nothing
  returning run_id into v_inserted;
  if v_inserted is null then  -- the same key committed meanwhile
    select * into v_row from {schema}.runs where idempotency_key = p_idempotency_key;
    return {schema}.same_request(v_row, p_idempotency_key, p_play, v_input, v_queue);
  end if;
  if v_api is not null then
    insert into {schema}.run_runtime_api (run_id, api) values (v_run, v_api);
  end if;
  perform {schema}.spawn_run_task(v_run, v_queue, v_max);
  return jsonb_build_object('runId', v_run, 'queue', v_queue, 'releaseId', v_release,
                            'created', true);
end;
$$;

create or replace function {schema}.run_row(p_run_id uuid, p_lock text default null)
  returns {schema}.runs
  language plpgsql
as $$
declare
  v_row {schema}.runs;
begin
  if p_run_id is null then
    raise exception 'a run id is required (a UUID).' using errcode = '22023';
  end if;
  if p_lock = 'update' then
    select * into v_row from {schema}.runs where run_id = p_run_id for update;
  elsif p_lock = 'share' then
    select * into v_row from {schema}.runs where run_id = p_run_id for share;
  else
    select * into v_row from {schema}.runs where run_id = p_run_id;
  end if;
  if not found then
    raise exception 'no run % in store %', p_run_id, trim(both '"' from '{schema}')
      using errcode = 'P0002';
  end if;
  return v_row;
end;
$$;

-- Deliver integration event p_event_key (payload p_payload) to run p_run_id;
-- the first delivery of a key wins, a repeat is a duplicate. A run that was
-- retried (`runs retry`) passes the event on to its retry. A failed or
-- cancelled run keeps the event for a retry of it; a completed one ignores it.
-- The payload is the signal row; the engine event only wakes the run.
create or replace function {schema}.signal_run(
  p_run_id uuid, p_event_key text, p_payload jsonb default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_row {schema}.runs;
  v_hops integer := 0;
  v_received timestamptz;
  v_result jsonb;
begin
  if p_event_key is null then
    raise exception 'signal needs an event key (a non-blank string).' using errcode = '22023';
  end if;
  perform {schema}.checked_key(p_event_key, 'an event key');
  perform {schema}.checked_size(coalesce(p_payload, 'null'::jsonb), 'the event''s payload');
  -- Locked (shared): a `lanes move` or `runs retry` of the run commits before
  -- this reads its queue, or waits until this has emitted there.
  v_row := {schema}.run_row(p_run_id, 'share');
  while v_row.status in ('completed', 'failed', 'cancelled') and v_row.retried_by is not null
        and v_hops < 100 loop
    v_hops := v_hops + 1;
    v_row := {schema}.run_row(v_row.retried_by, 'share');
  end loop;
  v_result := jsonb_build_object('runId', p_run_id, 'eventKey', p_event_key,
                                 'deliveredTo', v_row.run_id);
  if v_row.status in ('completed', 'failed', 'cancelled') then
    if v_row.status = 'completed' then
      return v_result || jsonb_build_object('delivered', false, 'duplicate', false,
                                            'runEnded', v_row.status, 'deliveredTo', null,
                                            'keptForRetry', false);
    end if;
    -- Nothing waits for it now, but a retry of the run will (copy_signals).
    insert into {schema}.signals (run_id, event_key, payload)
    values (v_row.run_id, p_event_key, p_payload)
    on conflict (run_id, event_key) do nothing
    returning received_at into v_received;
    return v_result || jsonb_build_object('delivered', false, 'duplicate', v_received is null,
                                          'runEnded', v_row.status,
                                          'keptForRetry', v_received is not null);
  end if;
  insert into {schema}.signals (run_id, event_key, payload)
  values (v_row.run_id, p_event_key, p_payload)
  on conflict (run_id, event_key) do nothing
  returning received_at into v_received;
  if v_received is null then
    return v_result || jsonb_build_object('delivered', false, 'duplicate', true,
                                          'runEnded', null, 'keptForRetry', false);
  end if;
  perform absurd.emit_event(v_row.queue, 'evt:' || v_row.run_id || ':' || p_event_key, p_payload);
  perform pg_notify('lane_worker_' || v_row.queue, v_row.run_id::text);
  return v_result || jsonb_build_object('delivered', true, 'duplicate', false,
                                        'runEnded', null, 'keptForRetry', false);
end;
$$;

-- Cancel run p_run_id: its engine task is cancelled and the run settles
-- `cancelled` with its `run.cancelled` fact (source client; p_reason, when
-- given, recorded in the fact). A run that already ended is left as it is.
create or replace function {schema}.cancel_run(p_run_id uuid, p_reason text default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_row {schema}.runs;
  v_fact jsonb;
begin
  if char_length(p_reason) > 1000 then
    raise exception 'a cancel reason has at most 1000 characters.' using errcode = '22023';
  end if;
  -- Locked: a `lanes move` in progress gives the run a new engine task.
  v_row := {schema}.run_row(p_run_id, 'update');
  if v_row.status in ('completed', 'failed', 'cancelled') then
    return jsonb_build_object('runId', v_row.run_id, 'cancelled', false, 'status', v_row.status);
  end if;
  if v_row.task_id is not null then
    perform absurd.cancel_task(v_row.queue, v_row.task_id);
  end if;
  v_fact := jsonb_build_object(
    'type', 'run.cancelled', 'runId', v_row.run_id::text,
    'occurredAt', floor(extract(epoch from clock_timestamp()) * 1000)::bigint,
    'source', 'client');
  if p_reason is not null then
    v_fact := v_fact || jsonb_build_object('reason', p_reason);
  end if;
  return jsonb_build_object(
    'runId', v_row.run_id,
    'cancelled', {schema}.settle_run(v_row.run_id, null, 'cancelled', null, null,
                                     'run.cancelled', v_fact, null) is not null,
    'status', 'cancelled');
end;
$$;

-- run_status, the fourth function, is defined with the ledger's delivery
-- state it shows (migration 0009).
