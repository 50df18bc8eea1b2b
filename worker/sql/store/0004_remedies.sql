-- Remedies. Additive: builds before this one ignore the new columns. `if not
-- exists` because a store migrated by a development build between 0003 and
-- this file may already hold some of them.
--
-- `runs retry` links the new run to the one it repeats; `runs` lists newest
-- first without reading the whole history.
alter table {schema}.runs add column if not exists retry_of uuid;
create index if not exists runs_created_idx on {schema}.runs (created_at);

-- `lanes prune` dropped the lane's engine queue (its tables); the lane row and
-- its runs stay as history. Activating the lane again recreates the queue.
alter table {schema}.releases add column if not exists pruned_at timestamptz;
