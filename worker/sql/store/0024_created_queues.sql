-- The engine queues lane-worker created (issue 29): `lanes prune` drops only
-- these. The TypeScript app creates queues on the same engine, lane-named ones
-- too when release ids coincide; a lane row (a worker's registration, `lanes
-- retire --force`) does not make such a queue lane-worker's, and dropping it
-- broke the app's next spawn ("relation absurd.t_<queue> does not exist").
-- A row is written in the transaction that created the queue (worker/db/engine.py
-- ensure_queue's callers, and ensure_lane_queue below), with the engine queue
-- row's created_at: a queue dropped by other means (absurdctl, an older build's
-- prune) and made again by another system is a new queue, not the recorded one.
-- Builds before this one create queues without a row: `lanes prune` keeps those.
create table {schema}.created_queues (
  queue text primary key,
  -- absurd.queues.created_at of the queue this store created (its identity).
  queue_created_at timestamptz not null,
  recorded_at timestamptz not null default now(),
  -- true: recorded by this migration for a lane that existed before it, not at
  -- creation (its creator is unknown; see docs/DESIGN.md on prune).
  legacy boolean not null default false
);

-- Grandfathered: every existing engine queue a lane row or a run of this store
-- names (a queue only the SQL API's submit created has no lane row), so fleets
-- that upgrade keep pruning their old lanes. The engine schema may not be
-- installed yet (a store migrated first): then there is no queue to record.
do $$
begin
  if to_regclass('absurd.queues') is not null then
    insert into {schema}.created_queues (queue, queue_created_at, legacy)
    select q.queue_name, q.created_at, true
      from absurd.queues q
     where exists (select 1 from {schema}.releases l where l.queue = q.queue_name)
        or exists (select 1 from {schema}.runs r where r.queue = q.queue_name)
    on conflict (queue) do nothing;
  end if;
end;
$$;

-- Make lane queue p_queue ready (idempotent; serialized per queue, so two first
-- submits to a new lane do not race the engine's DDL). As in migration 0023,
-- lane-worker's cleanup policy (worker/db/engine.py's QUEUE_CLEANUP_TTL / _LIMIT)
-- goes on the queue only when this transaction created it (the queue row carries
-- this transaction's xmin; a subtransaction's reads as not ours); now that
-- creation is recorded in created_queues too, in the same transaction.
create or replace function {schema}.ensure_lane_queue(p_queue text)
  returns void
  language plpgsql
as $$
begin
  if exists (select 1 from absurd.queues where queue_name = p_queue) then
    return;
  end if;
  perform pg_advisory_xact_lock(hashtext('lane_worker.queue'), hashtext(p_queue));
  if exists (select 1 from absurd.queues where queue_name = p_queue) then
    return;
  end if;
  perform absurd.create_queue(p_queue);
  if exists (select 1 from absurd.queues x
              where x.queue_name = p_queue
                and x.xmin = pg_current_xact_id_if_assigned()::xid) then
    perform absurd.set_queue_policy(
      p_queue, jsonb_build_object('cleanup_ttl', '6 hours', 'cleanup_limit', 1000));
    insert into {schema}.created_queues (queue, queue_created_at)
    select q.queue_name, q.created_at from absurd.queues q where q.queue_name = p_queue
    on conflict (queue) do update
       set queue_created_at = excluded.queue_created_at, recorded_at = now(), legacy = false;
  end if;
end;
$$;
