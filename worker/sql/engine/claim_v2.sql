-- Engine-side contract claim_v2: the own loop's claim begins its certain own
-- attempts as one set (the store's begin_attempts, migration 0028) instead of
-- one begin_attempt per run, and reads the claimed runs' store facts through
-- the store's static claimed_facts. Each run's result is claim_with_lanes_v1's
-- (the same columns, the same rule for what is begun): only the cost changed,
-- from one planned statement per run to a constant number per claim. The
-- engine-side pick is claim_lane_v1's, which this build installs too (claim_v1).
-- Names end in _v2 (docs/DESIGN.md "Builds side by side").
create schema if not exists lane_worker;

-- claim_with_lanes_v1's contract: the runs claim_lane_v1 hands out (mode
-- p_mode, 'all' when null), each with its store facts (lane_ columns, null
-- without a store row) and, with p_begin_release, the attempt begun for each
-- run the own loop will certainly own (begun_ columns): stamped with a release
-- of the claimer's lane p_own_queue, adopted by no other lane, its play among
-- p_plays, its store row not locked by another session. The facts are read by
-- a statement after the claim's, which sees a run submitted while it ran.
create or replace function lane_worker.claim_with_lanes_v2 (
  p_queue_name text,
  p_worker_id text,
  p_claim_timeout integer,
  p_qty integer,
  p_store_schema text,
  p_own_queue text,
  p_mode text,
  p_plays text[],
  p_begin_release text,
  p_begin_worker text,
  p_step_keys smallint
)
  returns table (
    run_id uuid,
    task_id uuid,
    attempt integer,
    task_name text,
    params jsonb,
    max_attempts integer,
    wake_event text,
    event_payload jsonb,
    swept integer,
    lane_run_id uuid,
    lane_release_id text,
    lane_adopted_release_id text,
    lane_adopted_queue text,
    lane_status text,
    lane_current_wait jsonb,
    lane_play text,
    lane_input jsonb,
    lane_lane_claiming boolean,
    lane_adopter_claiming boolean,
    begun_attempt_id bigint,
    begun_checkpoint jsonb,
    begun_step_keys smallint,
    begun_current_wait jsonb,
    begun_engine_checkpoints jsonb,
    begun_db_now_ms bigint
  )
  language plpgsql
as $$
declare
  v_runs uuid[];
  v_tasks uuid[];
  v_attempts integer[];
  v_names text[];
  v_params jsonb[];
  v_max integer[];
  v_events text[];
  v_payloads jsonb[];
  v_swept integer := 0;
  -- The database's clock as the claim starts: the worker pairs it with the
  -- moment it sent the claim (worker/run/handle.py DbClock), so a clock read
  -- after a slow claim would put every deadline it arms late by that much.
  v_db_now_ms bigint := (extract(epoch from absurd.current_time()) * 1000)::bigint;
begin
  select array_agg(c.run_id order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.task_id order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.attempt order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.task_name order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.params order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.max_attempts order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.wake_event order by c.run_id) filter (where c.run_id is not null),
         array_agg(c.event_payload order by c.run_id) filter (where c.run_id is not null),
         coalesce(max(c.swept), 0)
    into v_runs, v_tasks, v_attempts, v_names, v_params, v_max, v_events, v_payloads, v_swept
    from lane_worker.claim_lane_v1(p_queue_name, p_worker_id, p_claim_timeout, p_qty,
                                   p_store_schema,
                                   -- no mode: the engine claim's stand-in, on the claimer's own queue
                                   case when p_mode is null then coalesce(p_own_queue, p_queue_name)
                                        else p_own_queue end,
                                   coalesce(p_mode, 'all'), p_plays) c;

  if v_runs is null then
    -- Nothing handed out; a sweep still reaches the caller, whose reconciler
    -- settles what it may have failed for good.
    if v_swept > 0 then
      swept := v_swept;
      return next;
    end if;
    return;
  end if;

  return query execute format(
    'with c as (
       select * from unnest($1, $2, $3, $4, $5, $6, $7, $8)
                with ordinality as c(run_id, task_id, attempt, task_name, params, max_attempts,
                                     wake_event, event_payload, n)
     ), f as (
       select * from %1$I.claimed_facts($2, $9, $10)
     ), own as (
       select c.run_id as engine_run_id, f.run_id, c.attempt, c.task_id
         from c join f on f.task_id = c.task_id
        where $10 is not null and f.run_id is not null and f.on_own_lane
          and (f.adopted_release_id is null or f.adopted_queue = $9)
          and f.play = any($11)
     ), begun as (
       select * from %1$I.begin_attempts(
         array(select o.run_id from own o order by o.engine_run_id),
         array(select o.engine_run_id from own o order by o.engine_run_id),
         array(select o.attempt from own o order by o.engine_run_id),
         array(select o.task_id from own o order by o.engine_run_id),
         $12, $10, $13, $14)
     )
     select c.run_id, c.task_id, c.attempt, c.task_name, c.params, c.max_attempts,
            c.wake_event, c.event_payload, $15::integer,
            f.run_id, f.release_id, f.adopted_release_id, f.adopted_queue, f.status,
            f.current_wait, f.play, f.input, f.lane_claiming, f.adopter_claiming,
            b.attempt_id, b.checkpoint, b.step_keys, b.current_wait, b.engine_checkpoints,
            case when b.attempt_id is not null then $16 end
       from c
       left join f on f.task_id = c.task_id
       left join begun b on b.engine_run_id = c.run_id
      order by c.n',
    p_store_schema)
  using v_runs, v_tasks, v_attempts, v_names, v_params, v_max, v_events, v_payloads,
        p_own_queue, p_begin_release, p_plays, p_begin_worker, p_step_keys, p_queue_name,
        v_swept, v_db_now_ms;
end;
$$;

-- claim_next_v1 over claim_with_lanes_v2: a loop's claim and, when it handed
-- out fewer runs than p_qty, one more row (run_id null, due_known true) with
-- the seconds until the next run this loop could claim. Without p_with_lanes
-- it is claim_next_v1.
create or replace function lane_worker.claim_next_v2 (
  p_queue_name text,
  p_worker_id text,
  p_claim_timeout integer,
  p_qty integer,
  p_store_schema text,
  p_own_queue text,
  p_mode text,
  p_plays text[],
  p_with_lanes boolean,
  p_begin_release text,
  p_begin_worker text,
  p_step_keys smallint
)
  returns table (
    run_id uuid,
    task_id uuid,
    attempt integer,
    task_name text,
    params jsonb,
    max_attempts integer,
    wake_event text,
    event_payload jsonb,
    swept integer,
    lane_run_id uuid,
    lane_release_id text,
    lane_adopted_release_id text,
    lane_adopted_queue text,
    lane_status text,
    lane_current_wait jsonb,
    lane_play text,
    lane_input jsonb,
    lane_lane_claiming boolean,
    lane_adopter_claiming boolean,
    begun_attempt_id bigint,
    begun_checkpoint jsonb,
    begun_step_keys smallint,
    begun_current_wait jsonb,
    begun_engine_checkpoints jsonb,
    begun_db_now_ms bigint,
    due_known boolean,
    due_in_s double precision
  )
  language plpgsql
as $$
declare
  v_rows integer;
begin
  if not p_with_lanes then
    -- Without the store's facts nothing differs from v1.
    return query
      select * from lane_worker.claim_next_v1(p_queue_name, p_worker_id, p_claim_timeout, p_qty,
                                              p_store_schema, p_own_queue, p_mode, p_plays,
                                              false, null, null, null);
    return;
  end if;
  return query
    select c.*, false, null::float8
      from lane_worker.claim_with_lanes_v2(p_queue_name, p_worker_id, p_claim_timeout, p_qty,
                                           p_store_schema, p_own_queue, p_mode, p_plays,
                                           p_begin_release, p_begin_worker, p_step_keys) c;
  -- Rows, not runs: a sweep's row of nulls counts, so a batch of one that only
  -- swept reports no due time (the caller then asks for it).
  get diagnostics v_rows = row_count;
  if v_rows < greatest(coalesce(p_qty, 1), 1) then
    swept := 0;
    due_known := true;
    due_in_s := lane_worker.next_due_in_v1(
      p_queue_name, p_store_schema,
      case when p_mode is null then coalesce(p_own_queue, p_queue_name) else p_own_queue end,
      p_mode, p_plays);
    return next;
  end if;
end;
$$;
