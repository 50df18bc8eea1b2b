-- Tasks on a lane queue that this store did not create (issue 29): the
-- TypeScript app shares a queue whenever release ids coincide. They are its
-- owner's: counted for operators (`lanes --json` foreignTasks), never run or
-- cancelled, and they keep `lanes prune` from dropping the queue, as every
-- unfinished task does (a pending sandbox cleanup too).

-- The unfinished tasks (pending, sleeping, running) of engine queue p_queue, and
-- how many of them this store did not create (no run row names the task, no
-- sandbox cleanup row either); zero for a queue the engine does not have.
create or replace function {schema}.queue_open_tasks(p_queue text,
                                                    out open_tasks bigint,
                                                    out foreign_tasks bigint)
  language plpgsql
  stable
as $$
begin
  open_tasks := 0;
  foreign_tasks := 0;
  if not exists (select 1 from absurd.queues q where q.queue_name = p_queue) then
    return;
  end if;
  execute format(
    'select count(*),
            count(*) filter (
              where not exists (select 1 from %1$s.runs r where r.task_id = t.task_id)
                and not exists (select 1 from %1$s.run_sandboxes x
                                 where x.cleanup_task_id = t.task_id))
       from absurd.%2$I t
      where t.state in (''pending'', ''sleeping'', ''running'')',
    '{schema}', 't_' || p_queue)
    into open_tasks, foreign_tasks;
end;
$$;

-- Hold off every writer of engine queue p_queue's tasks until this transaction
-- ends (a spawn, a claim), then say whether it has no unfinished task: what
-- `lanes prune` checks right before it drops the queue. True for a queue the
-- engine does not have.
create or replace function {schema}.queue_idle_locked(p_queue text)
  returns boolean
  language plpgsql
as $$
begin
  if not exists (select 1 from absurd.queues q where q.queue_name = p_queue) then
    return true;
  end if;
  execute format('lock table absurd.%I in share row exclusive mode', 't_' || p_queue);
  return (select open_tasks from {schema}.queue_open_tasks(p_queue)) = 0;
end;
$$;

-- Whether engine queue p_queue holds a task (in any state, until the queue's
-- cleanup removes it) that names a run of this store: a queue lane-worker used
-- even after `lanes move` took every run away from it.
create or replace function {schema}.queue_holds_own_task(p_queue text)
  returns boolean
  language plpgsql
  stable
as $$
declare
  v_found boolean;
begin
  if not exists (select 1 from absurd.queues q where q.queue_name = p_queue) then
    return false;
  end if;
  execute format(
    'select exists (select 1 from absurd.%2$I t
                     where exists (select 1 from %1$s.runs r
                                    where r.run_id::text = t.params->>''runId''))',
    '{schema}', 't_' || p_queue)
    into v_found;
  return v_found;
end;
$$;
