-- Least privilege (issue 33, first step). Every store function ran with its
-- caller's rights, so an app could submit only with the worker's table rights
-- (and with them read every run's input and the runtime API tokens). Now:
--
-- 1. The app's SQL API runs with its owner's rights: SECURITY DEFINER with a
--    pinned search_path (pg_catalog, then pg_temp last: a schema a caller can
--    write on the path would let it shadow what the function calls). Every
--    body, and every helper, trigger and engine function they reach, names
--    its objects schema-qualified (checked when this was written; the roles
--    matrix test calls each function as a role with no other rights). An
--    app role then needs only USAGE on this schema and EXECUTE on these.
--    Arguments are validated as before. `create or replace` resets these
--    properties: a later migration that redefines one of these functions
--    must restate `security definer set search_path = pg_catalog, pg_temp`
--    (tests/integration/test_roles_matrix.py fails otherwise).
-- 2. No store function is executable by PUBLIC any more: a role is granted
--    what its job needs (`lane-worker roles`). The owner keeps every right,
--    so a worker, CLI or older build connecting as the owner (as all did)
--    changes nothing. A role that was granted rights on the store's `runs`
--    table by hand (an operator's own worker or app role) is granted
--    EXECUTE on every store function here, so what it ran before still runs.
-- 3. ensure_lane_queue (the lane's engine queue, created at a lane's first
--    submit) is left as it was: it is reached through submit_run as the
--    owner, and a worker connecting as the owner calls it as before.

do $$
declare
  v_fn regprocedure;
  v_grantee text;
begin
  for v_fn in
    select p.oid::regprocedure
      from pg_catalog.pg_proc p
     where p.pronamespace = '{schema}'::regnamespace
       and not exists (  -- an extension's function is the extension's business
         select 1 from pg_catalog.pg_depend d
          where d.classid = 'pg_catalog.pg_proc'::regclass and d.objid = p.oid
            and d.deptype = 'e')
  loop
    execute pg_catalog.format('revoke execute on function %s from public', v_fn);
    for v_grantee in
      select distinct case when a.grantee = 0 then 'public'
                           else pg_catalog.quote_ident(r.rolname) end
        from pg_catalog.pg_class c
        cross join lateral pg_catalog.aclexplode(c.relacl) a
        left join pg_catalog.pg_roles r on r.oid = a.grantee
       where c.oid = '{schema}.runs'::regclass and a.grantee <> c.relowner
    loop
      execute pg_catalog.format('grant execute on function %s to %s', v_fn, v_grantee);
    end loop;
  end loop;
end
$$;

alter function {schema}.submit_run(text, jsonb, text, text, jsonb, integer)
  security definer set search_path = pg_catalog, pg_temp;
alter function {schema}.submit_runs(jsonb)
  security definer set search_path = pg_catalog, pg_temp;
alter function {schema}.signal_run(uuid, text, jsonb)
  security definer set search_path = pg_catalog, pg_temp;
alter function {schema}.cancel_run(uuid, text)
  security definer set search_path = pg_catalog, pg_temp;
alter function {schema}.run_status(uuid)
  security definer set search_path = pg_catalog, pg_temp;
alter function {schema}.report_runner_result(uuid, integer, jsonb)
  security definer set search_path = pg_catalog, pg_temp;
alter function {schema}.worker_release_id(text, text)
  security definer set search_path = pg_catalog, pg_temp;
-- value_limits() reads nothing (constants): it stays the caller's, granted to the app.
