-- The store schema's own bookkeeping: how worker/db/schema.py applies the
-- numbered migrations (NNNN_name.sql beside this file) once each, in order.
-- Each starts with a `-- name: <name>` line; `{schema}` is the quoted store
-- schema (worker/db/sql.py). Values are always bound parameters.

-- name: lock
-- One migrator per store schema at a time ($1: the schema's raw name).
select pg_advisory_xact_lock(hashtext('lane_worker.store:' || $1));

-- name: create_schema
create schema if not exists {schema};

-- name: create_ledger
create table if not exists {schema}.schema_migrations (
  version integer primary key,
  name text not null,
  compatible boolean not null default true,
  applied_at timestamptz not null default now());

-- name: ledger_exists
-- $1: the ledger table's quoted name (a value: to_regclass reads it).
select to_regclass($1) is not null;

-- name: applied
select version, name, compatible from {schema}.schema_migrations;

-- name: record
insert into {schema}.schema_migrations (version, name, compatible) values ($1, $2, $3);

-- name: ledger_columns
-- The columns of table $2 in schema $1 (raw names), if it exists: is a
-- `schema_migrations` there the store's ledger or another system's?
-- From the catalog, not information_schema.columns: that view shows only the
-- columns the caller may use, so a role without rights on the ledger (the app's
-- own role, issue 33) saw none and was told another system owned the schema.
select a.attname::text as column_name
  from pg_catalog.pg_attribute a
  join pg_catalog.pg_class c on c.oid = a.attrelid
  join pg_catalog.pg_namespace n on n.oid = c.relnamespace
 where n.nspname = $1 and c.relname = $2 and c.relkind in ('r', 'p', 'v', 'f', 'm')
   and a.attnum > 0 and not a.attisdropped;

-- name: existing_objects
-- Which of relations $2, functions $3 and types $4 (raw names) exist in schema $1;
-- kind: null for a relation or function, else what the type is.
select c.relname as name, null::text as kind
  from pg_class c join pg_namespace n on n.oid = c.relnamespace
 where n.nspname = $1 and c.relname = any ($2::text[])
   and c.relkind <> 'c'  -- a composite type's entry: named as a type below
union
select p.proname, null from pg_proc p join pg_namespace n on n.oid = p.pronamespace
 where n.nspname = $1 and p.proname = any ($3::text[])
union
select t.typname,
       case t.typtype when 'd' then 'domain' when 'e' then 'enum type'
                      when 'r' then 'range type' when 'm' then 'multirange type'
                      when 'c' then 'composite type' when 'p' then 'shell type'
                      else 'type' end
  from pg_type t join pg_namespace n on n.oid = t.typnamespace
  left join pg_class r on r.oid = t.typrelid
 where n.nspname = $1 and t.typname = any ($4::text[])
   -- A table's, view's or sequence's row type: that relation is named above.
   and coalesce(r.relkind, 'c') = 'c'
   -- An array type the server made for another type: it moves it out of the way.
   and not exists (select 1 from pg_type e where e.typarray = t.oid);
