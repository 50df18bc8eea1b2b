-- Ledger delivery: the ledger is the outbox of the facts a run's runtime API
-- (run_runtime_api, migration 0008) is told about. A fact of such a run is
-- written `pending`, in the transaction that wrote it (a trigger, so every
-- writer, also an older build's settle, gets it right); any live worker's
-- relay (worker/daemon/relay.py) claims it, POSTs it and marks it
-- `delivered` after a 2xx, or `failed` with the reason when the endpoint
-- refuses it for good (a 4xx other than 408 and 429) or the retry window
-- ends. Facts of runs without a runtime API have no delivery state (null).

alter table {schema}.ledger
  add column delivery text check (delivery in ('pending', 'delivered', 'failed')),
  add column delivery_attempts integer not null default 0,
  add column next_delivery_at timestamptz,
  add column delivered_at timestamptz,
  add column delivery_error jsonb,
  add column delivery_claimed_by text,
  add column delivery_claimed_until timestamptz;

-- published_at was never set: its index held every fact ever written.
drop index if exists {schema}.ledger_unpublished_idx;

-- The relay's claim: pending facts by due time, and each run's earliest
-- pending fact (facts of one run are delivered in order).
create index ledger_pending_due_idx on {schema}.ledger (next_delivery_at, fact_id)
  where delivery = 'pending';
create index ledger_pending_run_idx on {schema}.ledger (run_id, fact_id)
  where delivery = 'pending';
-- The drain report's count of undelivered facts (pending or given up).
create index ledger_undelivered_idx on {schema}.ledger (run_id)
  where delivery in ('pending', 'failed');

-- A run starts once, whichever attempt first runs its play.
create unique index ledger_one_start_fact on {schema}.ledger (run_id)
  where type = 'run.started';

create or replace function {schema}.ledger_outbox()
  returns trigger
  language plpgsql
as $$
begin
  if exists (select 1 from {schema}.run_runtime_api a where a.run_id = new.run_id) then
    new.delivery := 'pending';
    new.next_delivery_at := now();
    -- Wakes the relays at commit; their poll is the guarantee.
    perform pg_notify('lane_worker_ledger', '');
  end if;
  return new;
end;
$$;

create trigger ledger_outbox before insert on {schema}.ledger
  for each row execute function {schema}.ledger_outbox();

-- What `lane-worker status --json` prints about run p_run_id (the SQL API's
-- fourth function, migration 0008): its status, lane, attempts, output or
-- error, the steps it committed and which release's code committed each, and
-- its ledger facts with their delivery state. Never the runtime API context.
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
                   ''name'', c.checkpoint_name, ''releaseId'', a.release_id,
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
    'releaseId', v_row.release_id,
    'adoptedReleaseId', v_row.adopted_release_id,
    'queue', v_row.queue,
    'attempts', coalesce((
      select jsonb_agg(jsonb_build_object(
               'attempt', a.attempt, 'workerId', a.worker_id, 'releaseId', a.release_id,
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
