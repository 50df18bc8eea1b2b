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
