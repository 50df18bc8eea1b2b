-- A submit to a release whose machines cannot boot says it is not served (issue
-- 31, a new user's walk). lane_served (0034) answered served for the registry's
-- current release with machines > 0 even when every machine of it exited 78 (its
-- configuration refused) or 2 (its --app does not load) over and over: no worker
-- ever registered, and the app was told its run would be served.
--
-- 1. The scaler records on the release's row when its machines keep failing to
--    boot, with the judgement `releases deploy --wait` uses (BOOT_FAILS_FINAL
--    machines of the deploy in a row exiting the same code 78 or 2, from the
--    process backend's exit codes or Fly's machine events): `boot_failed` is its
--    word (exitCode, inARow, machine, logs, lastLine masked, reason) and
--    `boot_failed_for` the deploy it counts for (the row's deployed_at then). A
--    deploy again changes deployed_at, so an older record no longer counts; the
--    scaler clears it when a machine of the release is ready or a worker of its
--    lane is live, or a machine exits with another code.
-- 2. lane_served (0034's body, same signature; the lines changed are marked 0047)
--    answers served=false, with a warning naming the release, the recorded reason
--    and `lane-worker releases`, for a lane served only by that deploy while its
--    boot fails. A claiming lane row (one primary-key read, as before) or a live
--    worker still serve it.

alter table {schema}.deployments
  add column boot_failed jsonb,
  add column boot_failed_for timestamptz;

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
  v_current text;  -- 0047
  v_failed jsonb;  -- 0047
begin
  select l.status into v_status from {schema}.releases l where l.queue = p_queue;
  if v_status = 'claiming' then
    return '{"served": true}'::jsonb;
  end if;
  if exists (select 1 from {schema}.workers w
              where w.queue = p_queue and {schema}.worker_live(w.heartbeat_at, w.stopped_at)) then  -- 0047
    return '{"served": true}'::jsonb;
  end if;
  -- 0047: the current deploy serves it, unless its machines are recorded as failing
  -- to boot for this deploy (an older deploy's record no longer counts).
  select d.release_id,
         case when d.boot_failed_for = d.deployed_at then d.boot_failed end
    into v_current, v_failed
    from {schema}.deployments d
   where d.queue = p_queue and d.role = 'current' and d.desired > 0;
  if v_current is not null and v_failed is null then
    return '{"served": true}'::jsonb;
  end if;
  if v_current is not null then
    return jsonb_build_object('served', false, 'warning', format(
      'lane %s (release %s) is the current deploy, but its machines fail to boot (%s): no worker serves it, and the run waits there until one boots; see `lane-worker releases` for the scaler''s word and the machines'' logs, fix it and deploy again.',
      p_queue, quote_literal(v_current),
      coalesce(left(v_failed->>'reason', 600), 'exit ' || coalesce(v_failed->>'exitCode', '?'))));
  end if;  -- 0047 end
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
