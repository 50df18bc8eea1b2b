-- One meaning of "attempts" (issue 31 of the new user's walk, item 2): the
-- engine attempts a run spent, as max attempts counts them (runs.attempts).
-- `status` counted every claim that ran the play, so a run that parked twice
-- and completed on its one engine attempt showed 3 there and 1 in `runs` and
-- on the run page. A park and its resume are not attempts: run_status now says
-- `attemptCount` (and `maxAttempts`) and lists the claims as `claims`.
--
-- Same function, same fields as 0030 plus those three: `attempts` stays the
-- list of claims it always was, because older builds sharing this store (and
-- apps in other languages) read it as a list. Read `claims` and `attemptCount`.

create or replace function {schema}.run_status(p_run_id uuid)
  returns jsonb
  language plpgsql
  stable
as $$
declare
  v_row {schema}.runs := {schema}.run_row(p_run_id);
  v_steps jsonb := '[]';
  v_claims jsonb;
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
  -- Every claim of the run: one an attempt ran (own, adopt; a resumed park is a
  -- new claim of the same engine attempt) or a put-back (defer, refuse).
  v_claims := coalesce((
    select jsonb_agg(jsonb_build_object(
             'attempt', a.attempt, 'workerId', a.worker_id,
             'releaseId', {schema}.release_as_deployed(a.release_id),
             'disposition', a.disposition, 'outcome', a.outcome)
           order by a.attempt_id)
      from {schema}.attempts a where a.run_id = v_row.run_id), '[]');
  return jsonb_build_object(
    'runId', v_row.run_id,
    'play', v_row.play,
    'status', v_row.status,
    'releaseId', {schema}.release_as_deployed(v_row.release_id),
    'adoptedReleaseId', {schema}.release_as_deployed(v_row.adopted_release_id),
    'queue', v_row.queue,
    -- 0036: the engine attempts spent (what max attempts counts), as `runs`
    -- lists and the run page shows; the claims under their own name ...
    'attemptCount', v_row.attempts,
    'maxAttempts', v_row.max_attempts,
    'claims', v_claims,
    -- ... and under their old name, for older builds and apps that read it.
    'attempts', v_claims,
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
