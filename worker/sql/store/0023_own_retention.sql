-- lane-worker keeps its own retention and leaves every other queue's policy as
-- its creator set it (issue 29). Before, every ensure of a queue set lane-worker's
-- cleanup policy (6 hours, 1000) on it, so a queue the TypeScript app created
-- first (release ids coincide: dev `runs`) had its finished tasks deleted by the
-- app's own cleanup after 6 hours instead of its 30 days; and 0022's clean_own
-- kept to the queue's policy, so on such a queue left as it was lane-worker's own
-- tasks would wait 30 days. Now the policy goes only on a queue lane-worker
-- creates (worker/db/engine.py ensure_queue, and ensure_lane_queue below), and
-- clean_own keeps to lane-worker's retention for its own tasks on any queue.
-- Same names, arguments and results: builds that call either function keep
-- working; an older build still sets its policy on any queue it ensures.

-- Make lane queue p_queue ready (idempotent; serialized per queue, so two first
-- submits to a new lane do not race the engine's DDL). lane-worker's cleanup
-- policy (worker/db/engine.py's QUEUE_CLEANUP_TTL / _LIMIT) goes on the queue only
-- when this transaction created it: absurd.create_queue does nothing on a queue
-- another session made meanwhile (our advisory lock is not theirs), whose row then
-- carries that session's xmin. A queue made in a subtransaction reads as not ours,
-- and keeps the engine's default policy: never lane-worker's on a queue it may not own.
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
  end if;
end;
$$;

-- One bounded cleanup batch of engine queue p_queue, of what this store created,
-- by lane-worker's own retention (6 hours, at most 1000 of each a call), whatever
-- the queue's policy, on the engine's clock: what 0022's clean_own deletes
-- (finished tasks a run row names, as its task or, on a `play-run` task, by its
-- params' runId; or a sandbox cleanup row names; with their engine runs,
-- checkpoints, waits and idempotency keys; old events with lane-worker's names
-- naming a run of this store). Zeros for a queue the engine does not have.
create or replace function {schema}.clean_own(p_queue text,
                                             out tasks_deleted integer,
                                             out events_deleted integer)
  language plpgsql
as $$
declare
  -- lane-worker's retention: worker/db/engine.py's QUEUE_CLEANUP_TTL / _LIMIT.
  v_ttl constant interval := interval '6 hours';
  v_limit constant integer := 1000;
  v_cutoff timestamptz;
  v_keys text := '';
  v_uuid constant text := '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
begin
  tasks_deleted := 0;
  events_deleted := 0;
  if not exists (select 1 from absurd.queues q where q.queue_name = p_queue) then
    return;
  end if;
  v_cutoff := absurd.current_time() - v_ttl;
  -- Only a partitioned queue keeps its idempotency keys in a table of their own.
  if to_regclass(format('absurd.%I', 'i_' || p_queue)) is not null then
    v_keys := format(', gone_keys as (delete from absurd.%I k
                                        where k.task_id in (select task_id from picked))',
                     'i_' || p_queue);
  end if;
  -- The ownership test is the claim's (lane_worker.ours_v1) widened to finished
  -- tasks: scalar probes of the store's indexes, the costly ones only when needed.
  execute format(
    'with picked as (
       select t.task_id
         from absurd.%1$I t
         left join absurd.%2$I last_run on last_run.run_id = t.last_attempt_run
        where t.state in (''completed'', ''failed'', ''cancelled'')
          and (case t.state when ''completed'' then last_run.completed_at
                            when ''failed'' then last_run.failed_at
                            else t.cancelled_at end) < $1
          and coalesce(
                (select true from %5$s.runs s where s.task_id = t.task_id),
                case when t.task_name = ''play-run''
                     then (select true from %5$s.runs s
                            where s.run_id = case when t.params->>''runId'' ~* $3
                                                  then (t.params->>''runId'')::uuid end) end,
                case when t.task_name = ''daytona-sandbox-cleanup''
                     then (select true from %5$s.run_sandboxes x
                            where x.cleanup_task_id = t.task_id limit 1) end,
                false)
        order by (case t.state when ''completed'' then last_run.completed_at
                               when ''failed'' then last_run.failed_at
                               else t.cancelled_at end)
        limit $2),
     gone_waits as (delete from absurd.%3$I w where w.task_id in (select task_id from picked)),
     gone_checkpoints as (delete from absurd.%4$I c
                           where c.task_id in (select task_id from picked)),
     gone_runs as (delete from absurd.%2$I r where r.task_id in (select task_id from picked))
     %6$s,
     gone_tasks as (delete from absurd.%1$I t
                     where t.task_id in (select task_id from picked) returning 1)
     select count(*) from gone_tasks',
    't_' || p_queue, 'r_' || p_queue, 'w_' || p_queue, 'c_' || p_queue, '{schema}', v_keys)
    into tasks_deleted
    using v_cutoff, v_limit, v_uuid;
  execute format(
    'with picked as (
       select e.event_name
         from absurd.%1$I e
        where e.emitted_at < $1
          and split_part(e.event_name, '':'', 1) in (''evt'', ''runner-terminal'')
          and exists (select 1 from %2$s.runs s
                       where s.run_id = case when split_part(e.event_name, '':'', 2) ~* $3
                                             then split_part(e.event_name, '':'', 2)::uuid end)
        order by e.emitted_at
        limit $2),
     gone as (delete from absurd.%1$I e
               where e.event_name in (select event_name from picked) returning 1)
     select count(*) from gone',
    'e_' || p_queue, '{schema}')
    into events_deleted
    using v_cutoff, v_limit, v_uuid;
end;
$$;
