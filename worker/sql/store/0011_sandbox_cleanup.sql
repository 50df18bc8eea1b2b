-- Sandbox cleanup: a run records the Daytona sandboxes it created
-- (`ctx.register_sandbox`); when it ends, whoever ends it (a worker, a cancel,
-- an operator, the reconciler, an older build), one engine task
-- `daytona-sandbox-cleanup` with params {runId, sandboxId} is spawned per
-- sandbox on the run's lane queue (the adopter's, if a newer release adopted
-- it), in the transaction that ends the run: a trigger on the run's status.
-- A worker deletes the sandbox (worker/run/sandbox.py) and records it here.

create table {schema}.run_sandboxes (
  run_id uuid not null references {schema}.runs (run_id) on delete cascade,
  sandbox_id text not null check (char_length(sandbox_id) between 1 and 255),
  registered_at timestamptz not null default now(),
  -- null while the run is open; pending: its cleanup task waits or runs;
  -- done: deleted (or found gone); failed: given up after its last attempt.
  cleanup text check (cleanup in ('pending', 'done', 'failed')),
  cleanup_queue text,
  cleanup_task_id uuid,
  cleanup_attempts integer not null default 0,
  cleanup_error jsonb,
  cleaned_at timestamptz,
  primary key (run_id, sandbox_id)
);

-- The lane registry and the drain report read pending cleanups per lane; a
-- continuation claim finds a cleanup task's row by its engine task.
create index run_sandboxes_pending_queue_idx on {schema}.run_sandboxes (cleanup_queue)
  where cleanup = 'pending';
create index run_sandboxes_pending_task_idx on {schema}.run_sandboxes (cleanup_task_id)
  where cleanup = 'pending';
create index run_sandboxes_failed_idx on {schema}.run_sandboxes (cleanup_queue)
  where cleanup = 'failed';

-- Spawn the cleanup task of every sandbox of run p_run_id that has none yet.
-- Up to 20 attempts, the first retry 2 s later, doubling, at most 10 minutes apart.
create or replace function {schema}.spawn_sandbox_cleanups(p_run_id uuid)
  returns integer
  language plpgsql
as $$
declare
  v_queue text;
  v_box record;
  v_task uuid;
  v_spawned integer := 0;
begin
  select coalesce(r.adopted_queue, r.queue) into v_queue
    from {schema}.runs r where r.run_id = p_run_id;
  for v_box in
    select x.sandbox_id from {schema}.run_sandboxes x
     where x.run_id = p_run_id and x.cleanup is null
     order by x.registered_at, x.sandbox_id
     for update
  loop
    perform {schema}.ensure_lane_queue(v_queue);
    select s.task_id into v_task
      from absurd.spawn_task(
             v_queue, 'daytona-sandbox-cleanup',
             jsonb_build_object('runId', p_run_id::text, 'sandboxId', v_box.sandbox_id),
             jsonb_build_object(
               'max_attempts', 20,
               'retry_strategy', jsonb_build_object('kind', 'exponential', 'base_seconds', 2,
                                                    'factor', 2, 'max_seconds', 600))) s;
    update {schema}.run_sandboxes
       set cleanup = 'pending', cleanup_queue = v_queue, cleanup_task_id = v_task
     where run_id = p_run_id and sandbox_id = v_box.sandbox_id;
    v_spawned := v_spawned + 1;
  end loop;
  if v_spawned > 0 then
    perform pg_notify('lane_worker_' || v_queue, p_run_id::text);
  end if;
  return v_spawned;
end;
$$;

create or replace function {schema}.runs_sandbox_cleanup()
  returns trigger
  language plpgsql
as $$
begin
  if exists (select 1 from {schema}.run_sandboxes x where x.run_id = new.run_id) then
    perform {schema}.spawn_sandbox_cleanups(new.run_id);
  end if;
  return null;
end;
$$;

create trigger runs_sandbox_cleanup
  after update of status on {schema}.runs
  for each row
  when (new.status in ('completed', 'failed', 'cancelled')
        and old.status not in ('completed', 'failed', 'cancelled'))
  execute function {schema}.runs_sandbox_cleanup();

-- Record sandbox p_sandbox_id of run p_run_id (again: nothing changes). A run
-- that has already ended gets its cleanup at once.
create or replace function {schema}.register_sandbox(p_run_id uuid, p_sandbox_id text)
  returns boolean
  language plpgsql
as $$
declare
  v_status text;
  v_inserted boolean;
begin
  if p_sandbox_id is null or {schema}.lane_trim(p_sandbox_id) = '' or char_length(p_sandbox_id) > 255 then
    raise exception 'a sandbox id is a non-blank string of at most 255 characters.'
      using errcode = '22023';
  end if;
  select status into v_status from {schema}.runs where run_id = p_run_id for share;
  if not found then
    raise exception 'no run % in store %', p_run_id, trim(both '"' from '{schema}')
      using errcode = 'P0002';
  end if;
  insert into {schema}.run_sandboxes (run_id, sandbox_id) values (p_run_id, p_sandbox_id)
  on conflict do nothing;
  v_inserted := found;
  if v_status in ('completed', 'failed', 'cancelled') then
    perform {schema}.spawn_sandbox_cleanups(p_run_id);
  end if;
  return v_inserted;
end;
$$;
