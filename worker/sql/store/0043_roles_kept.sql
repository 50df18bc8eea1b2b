-- Least privilege (issue 33, third step): the Python client as the app's role,
-- and grants that outlive a migration.
--
-- 1. schema_versions(): which store migrations are applied, the engine schema's
--    version and lane-worker's engine contracts, as one JSON object. Every
--    client checks these before a call (a store too old or too new for its
--    build is refused with "run lane-worker migrate"); an app, viewer or scaler
--    role may read neither the ledger nor the engine schema, so this reads them
--    with the owner's rights. It returns versions and names only.
-- 2. role_templates: the prefixes `lane-worker roles --apply` made roles for,
--    so `migrate` grants what a later migration adds (a function, a table) to
--    those roles again. A prefix whose roles are gone is skipped.

create table if not exists {schema}.role_templates (
  prefix text primary key,
  applied_at timestamptz not null default now());

create or replace function {schema}.schema_versions()
  returns jsonb
  language plpgsql
  stable
  security definer
  set search_path = pg_catalog, pg_temp
as $$
declare
  v_engine text;
  v_contracts jsonb := '[]';
begin
  if pg_catalog.to_regprocedure('absurd.get_schema_version()') is not null then
    execute 'select absurd.get_schema_version()' into v_engine;
  end if;
  if pg_catalog.to_regclass('lane_worker.contracts') is not null then
    execute 'select coalesce(pg_catalog.jsonb_agg(c.contract order by c.contract), ''[]'')'
            ' from lane_worker.contracts c' into v_contracts;
  end if;
  return pg_catalog.jsonb_build_object(
    'store', (select coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                        'version', m.version, 'name', m.name, 'compatible', m.compatible)
                      order by m.version), '[]')
                from {schema}.schema_migrations m),
    'engine', v_engine,
    'contracts', v_contracts);
end;
$$;
revoke execute on function {schema}.schema_versions() from public;

-- Roles applied before this migration with the default prefix (`lane-worker
-- roles --apply` of store 0041/0042), on this store: recorded, so this very
-- migrate grants them schema_versions(). A role of that name that holds no
-- right on this store is another store's business: not recorded.
insert into {schema}.role_templates (prefix)
select 'lane_worker'
 where exists (select from pg_catalog.pg_roles where rolname = 'lane_worker_app')
   and pg_catalog.has_schema_privilege('lane_worker_app', '{schema}'::regnamespace::oid, 'USAGE')
on conflict (prefix) do nothing;
