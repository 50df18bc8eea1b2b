-- Group commit: the fenced writes of several runs in flight (a step's engine
-- checkpoint, a completion) in one statement, so one round trip and one commit
-- serve them all. Each write runs in a block of its own (a subtransaction): one
-- that fails (a lost lease, a cancelled run) is undone alone and reported by its
-- position; the others commit. The worker runs a failed write again as its own
-- statement, which raises the error its caller acts on, so the batch needs no
-- error mapping of its own. Keep batches well under 64 writes: a transaction
-- with more subtransactions than that slows every snapshot on the server.
--
-- A write that would wait for a lock longer than p_lock_wait_ms fails
-- (lock_not_available) and goes again alone: one run's blocked write must not
-- hold the others of its batch, nor the worker's connection, for long.
--
-- Each entry of p_writes is an object. k = 'checkpoint': q queue, t engine task,
-- n checkpoint name, s state (absent for SQL null), r engine run, x seconds to
-- extend the lease by (absent: none). k = 'complete': q queue, r engine run,
-- o output (absent for SQL null), u store run, a attempt, f the terminal fact.
create or replace function {schema}.write_batch(p_writes jsonb, p_lock_wait_ms integer)
  returns table (write_at integer, error_code text)
  language plpgsql
as $$
declare
  v_write jsonb;
  v_at integer := 0;
begin
  -- For this statement's transaction only (is_local).
  perform set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
  for v_write in select w from jsonb_array_elements(p_writes) as e(w) loop
    begin
      if v_write->>'k' = 'checkpoint' then
        perform absurd.set_task_checkpoint_state(
          v_write->>'q', (v_write->>'t')::uuid, v_write->>'n', v_write->'s',
          (v_write->>'r')::uuid, (v_write->>'x')::integer);
      elsif v_write->>'k' = 'complete' then
        perform {schema}.complete_attempt(
          v_write->>'q', (v_write->>'r')::uuid, v_write->'o', (v_write->>'u')::uuid,
          (v_write->>'a')::bigint, v_write->'f');
      else
        raise exception 'write_batch: unknown write kind "%"', v_write->>'k'
          using errcode = '22023';
      end if;
    exception when others then
      write_at := v_at;
      get stacked diagnostics error_code = returned_sqlstate;
      return next;
    end;
    v_at := v_at + 1;
  end loop;
end;
$$;
