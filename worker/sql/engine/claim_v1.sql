-- Engine-side contract claim_v1: lane-worker's own claims, beside
-- absurd.claim_task, for the loops whose claim the engine cannot express.
-- Every name here ends in _v1 (docs/DESIGN.md "Builds side by side"): builds of
-- different ages share one database, each calls the objects of its own
-- contracts, and worker/db/engine_schema.py installs this file only when
-- lane_worker.contracts says no build of a newer lane-worker version did.
-- Within v1 a body may be fixed but never change its meaning, name, arguments
-- or result columns: that is a new file, claim_v2.sql, beside this one.
--
-- The engine's own functions are untouched and called where they define the
-- semantics (fail_run for expired leases, cancel_task for cancellation
-- policies). The filters read the run-state store (schema p_store_schema):
-- each run's status, play and adopter lane (p_own_queue is the claimer's own
-- lane). The store is always one this build migrated (its workers migrate
-- before they claim), so its named rules are called, not spelled out again.
--
-- Lane-worker's tasks only: every mode, the expired-lease sweep, the
-- cancellation upkeep and the next due time see only tasks with a row in
-- this store (a run, or a sandbox's pending cleanup). Another system on
-- Absurd (the TypeScript workers) may put its tasks on the same queue when
-- release ids coincide: they are left untouched for their owner, whose own
-- claim (absurd.claim_task) also sweeps their expired leases.
--
-- The claimer's lane is read here, not trusted from the caller: a worker
-- whose lane is retired claims as mode 'drain' whatever mode it asked for
-- (lane_worker.claim_mode_v1), so a worker that has not yet seen its
-- retirement (no LISTEN, between two registry refreshes) cannot take what the
-- retirement gave to the claiming releases after `lanes wait` said drained.
--
-- Mode 'all': a claiming release on its own queue when nothing there needs
-- filtering: every due run of lane-worker's, exactly as absurd.claim_task hands
-- them out (the same candidates, lease, expired-lease sweep and cancellation
-- policies), but picked by two ordered scans of the engine's (state,
-- available_at) index instead of a sort of the whole pending set
-- (tests/integration/test_claim_all.py holds it to claim_task).
--
-- Mode 'own': a claiming release on its own queue, when runs there were
-- adopted by another lane, or when a live machine of the same lane registers a
-- play this app lacks (a rollout of mixed apps): everything due except those
-- (adoptees are their adopter's, this release is older than the code that
-- already ran them; a play only the other machine has is for that machine).
-- The 'drain' mode skips the latter on its own queue too.
--
-- Mode 'adopt': a claiming release's `:continuations` loop on a retired lane's
-- queue. Hands out runs whose durable wait is over (a due `sleeping` run, or a
-- `pending` one an event woke) and that it may take: the store's adoptable_by
-- (runs it adopted earlier, and runs parked in a wait whose play its app
-- registers, that no other claiming lane adopted and whose effective lane is
-- older than its own), and the retired lane's pending sandbox cleanups.
-- Everything else (fresh runs, retries and hand-backs of the retired lane,
-- which only that lane's draining workers may run, and runs another claiming
-- release adopted) is never handed out, so a defer is a race, not the normal path.
--
-- Mode 'mine': a claiming release's loop on a lane that claims too (it was
-- activated again after this release adopted runs there): only its adoptees.
-- On another lane's queue every mode hands out only runs whose play this app
-- registers (a machine of the same release with another app must not fail them).
--
-- Mode 'drain': every loop of a retired (draining) release, on its own queue
-- or another. Hands out only what no other release may run: runs whose
-- effective lane (the adopter's, else the queue's) is p_own_queue and that
-- need it (the store's needs_own_lane: not parked, or parked where nothing
-- could adopt it), and its own queue's pending sandbox cleanups. Other parked
-- runs are left to the claiming releases.
create schema if not exists lane_worker;

-- A predicate on engine table alias p_alias (a run `r` or a task `t`): its task
-- is lane-worker's, one this store has a row for. Scalar subqueries, not
-- exists ... or exists ...: the planner hashes such an `or` of semi-joins,
-- reading every store row per claim (46 ms at 30,000 runs), where these are
-- one index probe per candidate, and coalesce probes the second only when
-- the first found nothing.
create or replace function lane_worker.ours_v1(p_store_schema text, p_alias text)
  returns text
  language sql
  immutable
as $$
  select format(
    'coalesce((select true from %1$I.runs s_own where s_own.task_id = %2$s.task_id),
              (select true from %1$I.run_sandboxes x_own
                where x_own.cleanup_task_id = %2$s.task_id and x_own.cleanup = ''pending''
                limit 1),
              false)',
    p_store_schema, p_alias)
$$;

-- The mode a claim of lane p_own_queue's worker really has: 'drain' while the
-- lane is retired, else the mode asked for (null: the engine claim's stand-in).
create or replace function lane_worker.claim_mode_v1(
  p_store_schema text,
  p_own_queue text,
  p_mode text
)
  returns text
  language plpgsql
  stable
as $$
declare
  v_retired boolean;
begin
  execute format('select exists (select 1 from %I.releases where queue = $1 and status = ''retired'')',
                 p_store_schema)
    into v_retired
    using p_own_queue;
  return case when v_retired then 'drain' else p_mode end;
end;
$$;

create or replace function lane_worker.lane_filter_v1 (
  p_mode text,
  p_store_schema text,
  p_queue_name text,
  p_own_param text,
  p_plays_param text
)
  returns text
  language plpgsql
  immutable
as $$
begin
  -- A predicate on the engine run `r` of queue p_queue_name; p_own_param and
  -- p_plays_param are the placeholders ($n) bound to the claimer's own queue
  -- and its app's plays.
  if p_mode = 'all' then
    return 'r.state in (''pending'', ''sleeping'') and '
           || lane_worker.ours_v1(p_store_schema, 'r');
  elsif p_mode = 'own' then
    return format(
      'r.state in (''pending'', ''sleeping'')
       and %4$s
       and not exists (
             select 1 from %1$I.runs s
              where s.task_id = r.task_id
                and ((s.adopted_queue is not null and s.adopted_queue <> %2$s)
                     or (s.play <> all (%3$s)
                         and exists (
                               select 1 from %1$I.workers w
                                where w.queue = %2$s
                                  and %1$I.worker_live(w.heartbeat_at, w.stopped_at)
                                  and s.play = any (w.plays)))))',
      p_store_schema, p_own_param, p_plays_param, lane_worker.ours_v1(p_store_schema, 'r'));
  elsif p_mode = 'adopt' then
    return format(
      '((r.state = ''sleeping'' or (r.state = ''pending'' and r.event_payload is not null))
        and exists (
              select 1 from %1$I.runs s
               where s.task_id = r.task_id
                 and %1$I.adoptable_by(s.status, s.play, s.adopted_queue, %4$L, %2$s, %3$s)))
       -- a retired lane''s pending sandbox cleanup needs no play code: a
       -- claiming release takes it over, so it never waits for the old machines
       or (r.state in (''pending'', ''sleeping'')
           and exists (select 1 from %1$I.run_sandboxes x
                        where x.cleanup_task_id = r.task_id and x.cleanup = ''pending''))',
      p_store_schema, p_own_param, p_plays_param, p_queue_name);
  elsif p_mode = 'mine' then
    return format(
      'r.state in (''pending'', ''sleeping'')
       and exists (
             select 1 from %1$I.runs s
              where s.task_id = r.task_id and s.adopted_queue = %2$s
                and s.play = any (%3$s))',
      p_store_schema, p_own_param, p_plays_param);
  elsif p_mode = 'drain' then
    return format(
      'r.state in (''pending'', ''sleeping'')
       and (exists (
              select 1
                from %1$I.runs s
               where s.task_id = r.task_id
                 and coalesce(s.adopted_queue, %3$L) = %2$s
                 -- on the queue of another lane, only what this app can run; on
                 -- its own, not what a live machine of it with another app can
                 and (s.play = any (%4$s)
                      or (%3$L = %2$s
                          and not exists (
                                select 1 from %1$I.workers w
                                 where w.queue = %2$s
                                   and %1$I.worker_live(w.heartbeat_at, w.stopped_at)
                                   and s.play = any (w.plays))))
                 and %1$I.needs_own_lane(s.status, s.play, %2$s, s.queue))
            or (%3$L = %2$s
                and exists (select 1 from %1$I.run_sandboxes x
                             where x.cleanup_task_id = r.task_id and x.cleanup = ''pending'')))',
      p_store_schema, p_own_param, p_queue_name, p_plays_param);
  end if;
  raise exception 'lane_worker: unknown claim mode "%" (all, own, adopt, mine or drain)', p_mode
    using errcode = '22023';
end;
$$;

create or replace function lane_worker.next_due_in_v1 (
  p_queue_name text,
  p_store_schema text,
  p_own_queue text,
  p_mode text,
  p_plays text[]
)
  returns double precision
  language plpgsql
  stable
as $$
declare
  v_due double precision;
  v_filter text := lane_worker.lane_filter_v1(
    coalesce(lane_worker.claim_mode_v1(p_store_schema, p_own_queue, p_mode), 'all'),
    p_store_schema, p_queue_name, '$1', '$2');
begin
  -- Seconds until the next run lane_worker.claim_lane_v1 would hand out
  -- (negative: already due), or null when there is none. A running run's lease
  -- end counts too: the claim then sweeps it (nothing notifies when its worker
  -- died). An event wait without a timeout is due at 'infinity': no due time.
  -- One ordered walk of the (state, available_at) index per state, each
  -- stopping at its first match, instead of a min() over every row the filter
  -- must look at.
  execute format(
      'select extract(epoch from min(d.due) - absurd.current_time())::float8
         from ((select r.available_at as due from absurd.%1$I r
                 where r.state = ''pending'' and r.available_at < ''infinity'' and %2$s
                 order by r.available_at limit 1)
               union all
               (select r.available_at from absurd.%1$I r
                 where r.state = ''sleeping'' and r.available_at < ''infinity'' and %2$s
                 order by r.available_at limit 1)
               union all
               (select min(r.claim_expires_at) from absurd.%1$I r
                 where r.state = ''running'' and r.claim_expires_at is not null and %3$s)) d',
      'r_' || p_queue_name, v_filter, lane_worker.ours_v1(p_store_schema, 'r'))
    into v_due
    using p_own_queue, p_plays;
  return v_due;
end;
$$;

create or replace function lane_worker.claim_lane_v1 (
  p_queue_name text,
  p_worker_id text,
  p_claim_timeout integer,
  p_qty integer,
  p_store_schema text,
  p_own_queue text,
  p_mode text,
  p_plays text[]
)
  returns table (
    run_id uuid,
    task_id uuid,
    attempt integer,
    task_name text,
    params jsonb,
    retry_strategy jsonb,
    max_attempts integer,
    headers jsonb,
    wake_event text,
    event_payload jsonb,
    swept integer
  )
  language plpgsql
as $$
declare
  v_now timestamptz := absurd.current_time();
  v_qty integer := greatest(coalesce(p_qty, 1), 1);
  v_lease_until timestamptz;
  v_row record;
  v_swept integer := 0;
  v_claimed integer;
  v_mode text;
begin
  if p_store_schema is null or p_own_queue is null then
    raise exception 'lane_worker.claim_lane_v1 needs the store schema and the claimer''s own queue'
      using errcode = '22023';
  end if;
  if p_queue_name <> p_own_queue
     and (p_worker_id is null or right(p_worker_id, length(':continuations')) <> ':continuations') then
    raise exception 'lane_worker.claim_lane_v1 serves another lane''s queue only to worker ids ending in :continuations, got "%"', p_worker_id
      using errcode = '22023';
  end if;
  if (p_mode in ('adopt', 'mine') and p_queue_name = p_own_queue)
     or (p_mode in ('all', 'own') and p_queue_name <> p_own_queue) then
    raise exception 'lane_worker.claim_lane_v1 mode % does not serve queue % for lane %',
      p_mode, p_queue_name, p_own_queue
      using errcode = '22023';
  end if;
  perform absurd.validate_queue_name(p_queue_name);
  -- The claimer's lane row, share-locked until the claim commits, before any
  -- engine table is touched: claims never wait for each other (share locks),
  -- but a retirement's update of that row (set_release_status,
  -- retire_superseded) waits for every claim that read it as claiming, and a
  -- claim that starts after it waits and reads it as retired. Without the lock
  -- a claim that read 'claiming' could commit after the retirement and after
  -- `lanes wait` had said drained (review D7). Not `for key share`: a status
  -- update does not conflict with that one.
  execute format('select 1 from %I.releases where queue = $1 for share', p_store_schema)
    using p_own_queue;
  v_mode := lane_worker.claim_mode_v1(p_store_schema, p_own_queue, p_mode);
  if coalesce(p_claim_timeout, 0) > 0 then
    v_lease_until := v_now + make_interval(secs => p_claim_timeout);
  end if;

  -- A retired lane may have no own loop left to keep its queue healthy, so do
  -- the engine's claim-time upkeep here, bounded by the batch size, on
  -- lane-worker's tasks only (another system's are its own claim's business).
  for v_row in execute format(
      'select t.task_id from absurd.%I t
        where state in (''pending'', ''sleeping'', ''running'')
          and %s
          and cancellation is not null
          and ((cancellation->>''max_delay'')::bigint is not null
               and first_started_at is null
               and extract(epoch from ($1 - enqueue_at)) >= (cancellation->>''max_delay'')::bigint
            or (cancellation->>''max_duration'')::bigint is not null
               and first_started_at is not null
               and extract(epoch from ($1 - first_started_at)) >= (cancellation->>''max_duration'')::bigint)
        order by task_id
        limit $2',
      't_' || p_queue_name, lane_worker.ours_v1(p_store_schema, 't'))
    using v_now, v_qty
  loop
    perform absurd.cancel_task(p_queue_name, v_row.task_id);
  end loop;

  for v_row in execute format(
      'select r.run_id, r.claimed_by, r.claim_expires_at, r.attempt
         from absurd.%1$I r
         join absurd.%2$I t on t.task_id = r.task_id
        where r.state = ''running'' and r.claim_expires_at is not null
          and r.claim_expires_at <= $1
          and %3$s
        order by r.claim_expires_at, r.run_id
        limit $2
        -- the task row too: fail_run writes it, and one another session holds
        -- locked must hold up that run alone, not every claim of the queue
        for update of r, t skip locked',
      'r_' || p_queue_name, 't_' || p_queue_name, lane_worker.ours_v1(p_store_schema, 'r'))
    using v_now, v_qty
  loop
    perform absurd.fail_run(
      p_queue_name,
      v_row.run_id,
      jsonb_strip_nulls(jsonb_build_object(
        'name', '$ClaimTimeout',
        'message', 'lease expired before the worker finished (swept by lane_worker.claim_lane_v1)',
        'workerId', v_row.claimed_by,
        'claimExpiredAt', v_row.claim_expires_at,
        'attempt', v_row.attempt)),
      null);
    v_swept := v_swept + 1;
  end loop;

  -- The pick: the earliest due runs, as claim_task orders them, but read as two
  -- ordered walks of the (state, available_at) index, one per runnable state,
  -- each stopping after $2 rows it could lock, instead of a sort of every due
  -- run (29 ms at 30,000 pending, 0.3 ms this way). Like claim_task it skips a
  -- run whose run or task row another session holds locked (the claim writes
  -- both): waiting for it would hold up every other run of the queue. A task
  -- whose cancellation policy is already due is never handed out, even when the
  -- bounded upkeep above has not cancelled it yet (claim_task cancels every one
  -- first).
  return query execute format(
    'with pending_due as (
        select r.run_id, r.available_at
          from absurd.%1$I r
          join absurd.%2$I t on t.task_id = r.task_id
         where r.state = ''pending''
           and r.available_at <= $1
           and t.state in (''pending'', ''sleeping'', ''running'')
           and not %5$s
           and %4$s
         order by r.available_at, r.run_id
         limit $2
         for update of r, t skip locked
     ),
     sleeping_due as (
        select r.run_id, r.available_at
          from absurd.%1$I r
          join absurd.%2$I t on t.task_id = r.task_id
         where r.state = ''sleeping''
           and r.available_at <= $1
           and t.state in (''pending'', ''sleeping'', ''running'')
           and not %5$s
           and %4$s
         order by r.available_at, r.run_id
         limit $2
         for update of r, t skip locked
     ),
     picked as (
        select d.run_id
          from (select * from pending_due union all select * from sleeping_due) d
         order by d.available_at, d.run_id
         limit $2
     ),
     leased as (
        update absurd.%1$I r
           set state = ''running'', claimed_by = $3, claim_expires_at = $4,
               started_at = $1, available_at = $1
          from picked p
         where r.run_id = p.run_id
        returning r.run_id, r.task_id, r.attempt, r.available_at, r.wake_event, r.event_payload
     ),
     task_marked as (
        update absurd.%2$I t
           set state = ''running'',
               attempts = greatest(t.attempts, l.attempt),
               first_started_at = coalesce(t.first_started_at, $1),
               last_attempt_run = l.run_id
          from leased l
         where t.task_id = l.task_id
        returning t.task_id
     ),
     timed_out_waits as (
        delete from absurd.%3$I w
         using leased l
         where w.run_id = l.run_id and w.timeout_at is not null and w.timeout_at <= $1
        returning w.run_id
     )
     select l.run_id, l.task_id, l.attempt, t.task_name, t.params, t.retry_strategy,
            t.max_attempts, t.headers, l.wake_event, l.event_payload, $5::integer
       from leased l
       join absurd.%2$I t on t.task_id = l.task_id
      order by l.run_id',
    'r_' || p_queue_name, 't_' || p_queue_name, 'w_' || p_queue_name,
    lane_worker.lane_filter_v1(v_mode, p_store_schema, p_queue_name, '$6', '$7'),
    '(t.cancellation is not null
      and ((t.cancellation->>''max_delay'')::bigint is not null
           and t.first_started_at is null
           and extract(epoch from ($1 - t.enqueue_at)) >= (t.cancellation->>''max_delay'')::bigint
        or (t.cancellation->>''max_duration'')::bigint is not null
           and t.first_started_at is not null
           and extract(epoch from ($1 - t.first_started_at)) >= (t.cancellation->>''max_duration'')::bigint))')
  using v_now, v_qty, p_worker_id, v_lease_until, v_swept, p_own_queue, p_plays;

  -- Nothing to hand out but leases were swept: still tell the caller, whose
  -- reconciler must settle runs the sweep may have failed for good.
  get diagnostics v_claimed = row_count;
  if v_claimed = 0 and v_swept > 0 then
    return query select null::uuid, null::uuid, null::integer, null::text, null::jsonb,
                        null::jsonb, null::integer, null::jsonb, null::text, null::jsonb, v_swept;
  end if;
end;
$$;

-- One round trip for a loop's claim: the runs (claim_lane in mode p_mode, or
-- 'all' when it is null) and, for each, the store facts
-- its disposition is decided from (the lane_state query of the store's
-- attempts.sql, each of its columns prefixed lane_; null when the task has no
-- store row). The facts are read by a statement of their own, after the
-- claim: a run submitted while the claim ran is seen with its store row (one
-- statement's snapshot would be taken before the claim's own and could miss it).
--
-- With p_begin_release, the claimer's own loop also begins the attempts it
-- will certainly own (the store's begin_attempt, disposition 'own', as worker
-- p_begin_worker with step-key mapping p_step_keys): runs stamped with a
-- release of its lane (p_own_queue), adopted by no other lane, whose play its
-- app registers (p_plays).
-- That is the own loop's Own rule (worker/run/decide.py) narrowed to what the
-- store row alone decides; every other run is begun by the worker after it
-- decides. The begun_ columns are begin_attempt's row, null when not begun.
create or replace function lane_worker.claim_with_lanes_v1 (
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
  v_on_own_lane boolean;
  v_lockable boolean;
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
                                -- no mode: the engine's claim's stand-in, on the claimer's own queue
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

  swept := v_swept;
  -- Into the result's own columns; the begun_ ones start null on every row.
  for run_id, task_id, attempt, task_name, params, max_attempts, wake_event, event_payload,
      lane_run_id, lane_release_id, lane_adopted_release_id, lane_adopted_queue, lane_status,
      lane_current_wait, lane_play, lane_input, lane_lane_claiming, lane_adopter_claiming,
      v_on_own_lane, begun_attempt_id, begun_checkpoint, begun_step_keys, begun_current_wait,
      begun_engine_checkpoints, begun_db_now_ms in execute format(
    'select c.run_id, c.task_id, c.attempt, c.task_name, c.params, c.max_attempts,
            c.wake_event, c.event_payload,
            r.run_id, r.release_id, r.adopted_release_id, r.adopted_queue,
            r.status, r.current_wait, r.play, r.input,
            coalesce(l.status = ''claiming'', false),
            coalesce(al.status = ''claiming'', false),
            -- The lane guard: the run''s release and the claimer''s share a lane
            -- (two spellings of one id name one queue).
            -- (A task without a store row, a sandbox cleanup, has no release.)
            case when coalesce(r.release_id, '''') = '''' then false
                 when r.release_id = $10 then true
                 else %1$I.queue_for_release(r.release_id) = $9 end,
            null::bigint, null::jsonb, null::smallint, null::jsonb, null::jsonb, null::bigint
       from unnest($1, $2, $3, $4, $5, $6, $7, $8)
            as c(run_id, task_id, attempt, task_name, params, max_attempts, wake_event,
                 event_payload)
       left join %1$I.runs r on r.task_id = c.task_id
       left join %1$I.releases l on l.queue = r.queue
       left join %1$I.releases al on al.queue = r.adopted_queue
      order by c.run_id',
    p_store_schema)
  using v_runs, v_tasks, v_attempts, v_names, v_params, v_max, v_events, v_payloads,
        p_own_queue, p_begin_release
  loop
    v_lockable := null;
    if p_begin_release is not null
       and lane_run_id is not null
       and v_on_own_lane
       and (lane_adopted_release_id is null or lane_adopted_queue = p_own_queue)
       and lane_play = any(p_plays) then
      -- Its store row locked by another session (an operator's open transaction):
      -- not begun here, where the wait would hold up the whole claim; the worker
      -- begins it after the claim, holding up that run alone.
      execute format('select true from %I.runs where run_id = $1 for update skip locked',
                     p_store_schema)
        into v_lockable
        using lane_run_id;
    end if;
    if v_lockable then
      execute format('select * from %I.begin_attempt($1, $2, $3, $4, $5, ''own'', null, null,
                                                     $6, $7, $8)', p_store_schema)
        into begun_attempt_id, begun_checkpoint, begun_step_keys, begun_current_wait,
             begun_engine_checkpoints, begun_db_now_ms
        using lane_run_id, run_id, attempt, p_begin_worker, p_begin_release,
              p_step_keys, task_id, p_queue_name;
    end if;
    return next;
  end loop;
end;
$$;

-- Seconds until a run of queue p_queue_name is claimable by the engine's own
-- claim (absurd.claim_task, which filters nothing: for a caller without a
-- store; every loop of a worker asks next_due_in_v1), on the database's clock (negative: due already); null when none is. A running run's lease end
-- counts: the claim then sweeps it and its retry is claimable (no NOTIFY says
-- so when a worker died). An event wait without a timeout is due at
-- 'infinity', which is no due time (and which PostgreSQL before 17 cannot
-- subtract from).
create or replace function lane_worker.next_due_any_v1(p_queue_name text)
  returns double precision
  language plpgsql
  stable
as $$
declare
  v_due double precision;
begin
  execute format(
      'select extract(epoch from min(d.due) - absurd.current_time())::float8
         from (select min(available_at) as due from absurd.%1$I
                where state in (''pending'', ''sleeping'') and available_at < ''infinity''
               union all
               select min(claim_expires_at) from absurd.%1$I
                where state = ''running'' and claim_expires_at is not null) d',
      'r_' || p_queue_name)
    into v_due;
  return v_due;
end;
$$;

-- A loop's whole poll in one round trip: its claim (claim_with_lanes with
-- p_with_lanes, else claim_lane in mode p_mode) and, when that handed out
-- fewer runs than p_qty, one more row (run_id null, due_known true) carrying
-- due_in_s: the seconds until the next run this loop could claim (next_due_in_v1
-- for its mode, 'all' when it is null; null: none). It is read after the claim,
-- so the runs just claimed count by their lease end, not as due.
create or replace function lane_worker.claim_next_v1 (
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
  if p_with_lanes then
    return query
      select c.*, false, null::float8
        from lane_worker.claim_with_lanes_v1(p_queue_name, p_worker_id, p_claim_timeout, p_qty,
                                          p_store_schema, p_own_queue, p_mode, p_plays,
                                          p_begin_release, p_begin_worker, p_step_keys) c;
  else
    return query
      select c.run_id, c.task_id, c.attempt, c.task_name, c.params, c.max_attempts,
             c.wake_event, c.event_payload, c.swept,
             null::uuid, null::text, null::text, null::text, null::text, null::jsonb,
             null::text, null::jsonb, null::boolean, null::boolean,
             null::bigint, null::jsonb, null::smallint, null::jsonb, null::jsonb, null::bigint,
             false, null::float8
        from lane_worker.claim_lane_v1(p_queue_name, p_worker_id, p_claim_timeout, p_qty,
                                    p_store_schema, p_own_queue, p_mode, p_plays) c;
  end if;
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

-- The engine's extend_claim, waiting at most p_lock_wait_ms for the run's row
-- lock (then lock_not_available, 55P03). A lease keeper runs beside the run's
-- own writes on a pool of two connections: a row an operator's open
-- transaction keeps locked must not take a connection from every other run.
create or replace function lane_worker.extend_claim_within_v1 (
  p_queue_name text,
  p_run_id uuid,
  p_extend_by integer,
  p_lock_wait_ms integer
)
  returns void
  language plpgsql
as $$
begin
  perform set_config('lock_timeout', p_lock_wait_ms || 'ms', true);  -- this statement's only
  perform absurd.extend_claim(p_queue_name, p_run_id, p_extend_by);
end;
$$;

