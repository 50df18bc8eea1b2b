-- A cancel by an operator (the CLI's `cancel`, the page's cancel) said `client` as
-- its fact's source, like one by the app through the SQL API: the app could not
-- tell its own cancels from an operator's. Found by the attack round of
-- 2026-12-07. cancel_run_by names the source; cancel_run (the SQL API, which
-- older builds and the TypeScript client call) keeps its signature and says
-- `client` as before.
create or replace function {schema}.cancel_run_by(
  p_run_id uuid, p_reason text, p_source text)
  returns jsonb
  language plpgsql
as $$
declare
  v_row {schema}.runs;
begin
  if p_source is null or p_source not in ('client', 'operator') then
    raise exception 'a cancel''s source is client or operator, got %', p_source
      using errcode = '22023';
  end if;
  if char_length(p_reason) > 1000 then
    raise exception 'a cancel reason has at most 1000 characters.' using errcode = '22023';
  end if;
  -- Locked: a `lanes move` in progress gives the run a new engine task.
  v_row := {schema}.run_row(p_run_id, 'update');
  if v_row.status in ('completed', 'failed', 'cancelled') then
    return jsonb_build_object('runId', v_row.run_id, 'cancelled', false, 'status', v_row.status);
  end if;
  if v_row.task_id is not null then
    perform absurd.cancel_task(v_row.queue, v_row.task_id);
  end if;
  return jsonb_build_object(
    'runId', v_row.run_id,
    'cancelled', {schema}.settle_run(
      v_row.run_id, null, 'cancelled', null, null, 'run.cancelled',
      {schema}.terminal_fact('cancelled', v_row.run_id, null, null, p_source, p_reason),
      null) is not null,
    'status', 'cancelled');
end;
$$;

create or replace function {schema}.cancel_run(p_run_id uuid, p_reason text default null)
  returns jsonb
  language plpgsql
as $$
begin
  return {schema}.cancel_run_by(p_run_id, p_reason, 'client');
end;
$$;
