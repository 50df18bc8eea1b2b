-- One spelling of a release (issue 31 §1): every field that names a release
-- carries the release id as deployed (`rel-a`: the trimmed deploy version,
-- `dev-<suffix>` or `dev`), never the lane's sanitized segment (`rel_a`, what
-- the queue `runs_rel_a` is made of). Builds from this one write the deployed id
-- (lane registration, heartbeats, attempts, adoptions, retries, facts); builds
-- before wrote the segment for their own release, and share this store. Lanes
-- are still compared by queue only (`queue_for_release`), never by these strings:
-- nothing here takes part in a claim, an adoption or a lane guard.

-- The lane's release id as deployed, written by the registration of a build
-- from this one (null: only older builds registered the lane). `release_ids`
-- keeps every spelling seen, as before.
alter table {schema}.releases add column release_id text;

-- The release id of lane p_queue as deployed: the release registry's (a release
-- deployed through `releases deploy`), else the one its workers registered, else
-- the lane's first spelling recorded (older builds: the segment), else null.
create function {schema}.lane_release_id(p_queue text)
  returns text
  language sql
  stable
as $$
  select coalesce(
    (select d.release_id from {schema}.deployments d where d.queue = p_queue),
    (select coalesce(l.release_id, l.release_ids[1]) from {schema}.releases l
      where l.queue = p_queue))
$$;

-- How a row's release id is shown. A row that holds the segment spelling of its
-- lane (`rel_a` on `runs_rel_a`: what an older build wrote for its own release)
-- shows the lane's release id as deployed, when the store knows one; any other
-- spelling (the app's stamp, a deployed id) is shown as it is stored.
create function {schema}.release_as_deployed(p_release text)
  returns text
  language sql
  stable
as $$
  select case
    -- The class is spelled out: a regex range may follow the collation. Anything
    -- else is no segment (and never reaches queue_for_release, which refuses blanks).
    when p_release is null
      or p_release !~ '^[abcdefghijklmnopqrstuvwxyz0123456789_]+$'
      or {schema}.queue_for_release(p_release) <> 'runs_' || p_release
      then p_release
    else coalesce({schema}.lane_release_id('runs_' || p_release), p_release)
  end
$$;

-- run_status (0009) with every release it names as deployed: the run's stamp, its
-- adopter, each attempt's and each step's release. Same shape, same fields.
create or replace function {schema}.run_status(p_run_id uuid)
  returns jsonb
  language plpgsql
  stable
as $$
declare
  v_row {schema}.runs := {schema}.run_row(p_run_id);
  v_steps jsonb := '[]';
begin
  if v_row.task_id is not null then
    begin
      execute format(
        'select coalesce(jsonb_agg(jsonb_build_object(
                   ''name'', c.checkpoint_name,
                   ''releaseId'', {schema}.release_as_deployed(a.release_id),
                   ''attempt'', a.attempt, ''workerId'', a.worker_id,
                   ''committedAt'', c.updated_at)
                 order by c.updated_at, c.checkpoint_name), ''[]'')
           from absurd.%I c
           left join lateral (
             select a.attempt, a.release_id, a.worker_id
               from {schema}.attempts a
              where a.run_id = $2 and a.engine_run_id = c.owner_run_id
                and a.disposition in (''own'', ''adopt'') and a.claimed_at <= c.updated_at
              order by a.claimed_at desc, a.attempt_id desc
              limit 1) a on true
          where c.task_id = $1',
        'c_' || v_row.queue)
        into v_steps
        using v_row.task_id, v_row.run_id;
    exception when undefined_table then
      v_steps := '[]';  -- `lanes prune` dropped the lane's engine queue
    end;
  end if;
  return jsonb_build_object(
    'runId', v_row.run_id,
    'play', v_row.play,
    'status', v_row.status,
    'releaseId', {schema}.release_as_deployed(v_row.release_id),
    'adoptedReleaseId', {schema}.release_as_deployed(v_row.adopted_release_id),
    'queue', v_row.queue,
    'attempts', coalesce((
      select jsonb_agg(jsonb_build_object(
               'attempt', a.attempt, 'workerId', a.worker_id,
               'releaseId', {schema}.release_as_deployed(a.release_id),
               'disposition', a.disposition, 'outcome', a.outcome)
             order by a.attempt_id)
        from {schema}.attempts a where a.run_id = v_row.run_id), '[]'),
    'output', v_row.output,
    'error', v_row.error,
    'retryOf', v_row.retry_of,
    'steps', v_steps,
    'facts', coalesce((
      select jsonb_agg(
               jsonb_build_object('type', f.type, 'createdAt', f.created_at)
               || case when f.delivery is null then '{}'::jsonb
                  else jsonb_build_object('delivery', jsonb_build_object(
                         'state', f.delivery, 'attempts', f.delivery_attempts,
                         'deliveredAt', f.delivered_at,
                         'nextAttemptAt', case when f.delivery = 'pending'
                                               then f.next_delivery_at end,
                         'error', f.delivery_error))
                  end
               order by f.fact_id)
        from {schema}.ledger f where f.run_id = v_row.run_id), '[]'));
end;
$$;
