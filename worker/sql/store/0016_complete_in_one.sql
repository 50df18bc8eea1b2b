-- A completing attempt ends in one statement instead of a transaction of three
-- (the engine's complete, the store's settle with its terminal fact, the
-- attempt's own row): one round trip on the hot path, not five with BEGIN and
-- COMMIT. When the store's fence shows that a newer claim owns the run, it
-- raises LW001 and nothing of it stays, the engine's complete included; the
-- engine's own refusals (cancelled, not running) propagate as they are.
create or replace function {schema}.complete_attempt(
  p_queue text, p_engine_run uuid, p_output jsonb, p_run_id uuid, p_attempt bigint,
  p_fact jsonb)
  returns void
  language plpgsql
as $$
begin
  perform absurd.complete_run(p_queue, p_engine_run, p_output);
  if {schema}.settle_run(p_run_id, p_attempt, 'completed', p_output, null, 'run.completed',
                         p_fact, null) is null then
    raise exception using errcode = 'LW001',
      message = format('run %s was settled by a newer claim', p_run_id);
  end if;
  update {schema}.attempts
     set outcome = 'completed', error = null, finished_at = now()
   where attempt_id = p_attempt and outcome is null;
end;
$$;
