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
-- 0025's submit_run and submit_runs keep their bodies under new names
-- (submit_run_made, submit_runs_made); the API functions, same names and
-- signatures, call them and add the fields. Their bodies are not copied here,
-- so there is still one of each.
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

alter function {schema}.submit_run(text, jsonb, text, text, jsonb, integer)
  rename to submit_run_made;
alter function {schema}.submit_runs(jsonb) rename to submit_runs_made;

-- 0025's submit_run (now submit_run_made), its result with lane_served's fields.
create or replace function {schema}.submit_run(
  p_play text, p_input jsonb, p_release_id text,
  p_idempotency_key text default null, p_runtime_api jsonb default null,
  p_max_attempts integer default null)
  returns jsonb
  language plpgsql
as $$
declare
  v_made jsonb := {schema}.submit_run_made(p_play, p_input, p_release_id, p_idempotency_key,
                                           p_runtime_api, p_max_attempts);
begin
  return v_made || {schema}.lane_served(v_made ->> 'queue', v_made ->> 'releaseId');
end;
$$;

-- 0025's submit_runs (now submit_runs_made), each result with lane_served's
-- fields, worked out once per queue of the call.
create or replace function {schema}.submit_runs(p_items jsonb)
  returns jsonb
  language plpgsql
as $$
declare
  v_made jsonb := {schema}.submit_runs_made(p_items);
  v_served jsonb;
begin
  select jsonb_object_agg(l.queue, {schema}.lane_served(l.queue, l.release_id)) into v_served
    from (select distinct on (e ->> 'queue') e ->> 'queue' as queue, e ->> 'releaseId' as release_id
            from jsonb_array_elements(v_made) with ordinality as m(e, n)
           order by e ->> 'queue', n) l;
  return coalesce((select jsonb_agg(m.e || (v_served -> (m.e ->> 'queue')) order by m.n)
                     from jsonb_array_elements(v_made) with ordinality as m(e, n)), '[]'::jsonb);
end;
$$;
