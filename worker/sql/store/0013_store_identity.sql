-- Two small rules the registry needs (found in review of migration 0012).
--
-- 1. The store's identity: a random id made once, when this migration runs.
-- The scaler marks every machine it creates with it and lists only machines
-- carrying it, so scalers of two databases that share one Fly app or one
-- process-backend folder never stop or destroy each other's machines. Read by
-- `select {schema}.store_id()`.
create table {schema}.store_identity (
  singleton boolean primary key default true check (singleton),
  store_id uuid not null default gen_random_uuid(),
  created_at timestamptz not null default now()
);
insert into {schema}.store_identity default values;

create or replace function {schema}.store_id()
  returns text
  language sql
  stable
as $$
  select store_id::text from {schema}.store_identity
$$;

-- 2. A lane that claims again is not pruned. A rollback to a release whose
-- retired lane `lanes prune` had dropped (deploy_release sets it claiming) or
-- any other path back to claiming clears the mark, so the lane shows on the
-- page again and, once retired again, can be pruned again.
create or replace function {schema}.lane_claims_again()
  returns trigger
  language plpgsql
as $$
begin
  new.pruned_at := null;
  return new;
end;
$$;

create trigger releases_claims_again
  before update of status on {schema}.releases
  for each row
  when (new.status = 'claiming' and old.pruned_at is not null)
  execute function {schema}.lane_claims_again();
