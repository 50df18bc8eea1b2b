-- Maintenance deletes only what this store created (issue 29). The engine's
-- absurd.cleanup_all_queues deletes every finished task of a queue past its
-- policy's TTL, and every old event: on a queue shared with the TypeScript app
-- (release ids coincide) that took the app's finished tasks, their runs,
-- checkpoints and waits, and its events. Additive: an older build's pass still
-- calls the engine's cleanup until it is gone.

-- Maintenance asks, for every engine queue, whether a run of this store names it
-- (a queue only a submit created has no lane row): one index probe each.
create index if not exists runs_queue_idx on {schema}.runs (queue);

-- One bounded cleanup batch of engine queue p_queue by the queue's own policy
-- (absurd.queues: cleanup_ttl, cleanup_limit), on the engine's clock, of what
-- this store created:
-- * finished tasks (completed, failed, cancelled) that ended more than the TTL
--   ago and that a run row names (its task; or, for a task of lane-worker's
--   name for runs, `play-run`, by the runId of its params: a task `runs retry`
--   or `lanes move` replaced), or that a sandbox cleanup row names; another
--   system's task that carries one of our runIds in its params (a TypeScript
--   notifier's) is not named so; with their engine runs, checkpoints, waits and (on a
--   partitioned queue) idempotency keys. Oldest first, at most cleanup_limit.
-- * events emitted more than the TTL ago whose name is one lane-worker gives
--   (evt:<run>:<key>, runner-terminal:<run>:<attempt>, worker/checkpoint.py)
--   and names a run of this store. At most cleanup_limit.
-- Every other task and event is its owner's and stays. Zeros for a queue the
-- engine does not have.
create or replace function {schema}.clean_own(p_queue text,
                                             out tasks_deleted integer,
                                             out events_deleted integer)
  language plpgsql
as $$
declare
  v_ttl interval;
  v_limit integer;
  v_cutoff timestamptz;
  v_keys text := '';
  v_uuid constant text := '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
begin
  tasks_deleted := 0;
  events_deleted := 0;
  select q.cleanup_ttl, q.cleanup_limit into v_ttl, v_limit
    from absurd.queues q where q.queue_name = p_queue;
  if not found then
    return;
  end if;
  v_cutoff := absurd.current_time() - greatest(v_ttl, interval '0 seconds');
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
