-- Engine-side contract notify_v1: the NOTIFY that wakes a lane's claim loops.
-- Names end in _v1, the trigger's too (docs/DESIGN.md "Builds side by side"):
-- an older build's trigger (lane_worker_runnable, calling its own
-- notify_runnable) may sit beside this one on the same table, and a second
-- NOTIFY of one transaction on one channel with the same payload is folded
-- into the first. No build drops or replaces another contract's trigger.
create schema if not exists lane_worker;

-- A claim loop waits for a NOTIFY while LISTEN is connected and polls only
-- rarely, so every run that becomes claimable must notify: the store's submit,
-- signal and hand-back do; this trigger covers what is written straight
-- through the engine (an app that spawns without the store, a retry, a sleep
-- or a put-back, an event that wakes a run). It fires for rows that are
-- pending or sleeping after the write, not for claims or completions, and
-- pg_notify folds one transaction's notifications into one. A channel name
-- over 63 bytes cannot be notified: skipped, not an error (it must never fail
-- the engine's write); those workers poll.
create or replace function lane_worker.notify_runnable_v1()
  returns trigger
  language plpgsql
as $$
declare
  v_channel text := 'lane_worker_' || tg_argv[0];
begin
  if octet_length(v_channel) <= 63 then
    perform pg_notify(v_channel, '');
  end if;
  return null;
end;
$$;

-- Install that trigger on queue p_queue's engine run table once; true when this
-- call installed it.
create or replace function lane_worker.watch_queue_v1(p_queue text)
  returns boolean
  language plpgsql
as $$
declare
  v_table regclass := to_regclass(format('absurd.%I', 'r_' || p_queue));
begin
  if v_table is null then
    raise exception 'lane_worker.watch_queue_v1: queue "%" has no engine run table', p_queue
      using errcode = '42P01';
  end if;
  if exists (select 1 from pg_trigger
              where tgrelid = v_table and tgname = 'lane_worker_runnable_v1') then
    return false;
  end if;
  execute format(
    'create trigger lane_worker_runnable_v1 after insert or update on %s
       for each row when (new.state in (''pending'', ''sleeping''))
       execute function lane_worker.notify_runnable_v1(%L)',
    v_table, p_queue);
  return true;
exception when duplicate_object then
  return false;  -- another worker installed it meanwhile
end;
$$;
