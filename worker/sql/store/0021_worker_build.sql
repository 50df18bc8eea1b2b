-- Which build each worker runs, and which of its claim loops do not claim
-- (issue 29). Additive: an older build's heartbeat names its columns, so it
-- keeps working and leaves both null (its version reads "before 0.2.0": builds
-- before 0.2.0 recorded none).
--
-- version: lane-worker's version (worker/version.py), written with every beat.
-- claim_failures: null while every loop claims; else a JSON array, one object per
-- loop whose claims keep failing: {queue, loop, since, failures, reason} (reason:
-- one line, at most 200 characters, the database URL's secrets masked; since: on
-- the database's clock).
alter table {schema}.workers
  add column if not exists version text,
  add column if not exists claim_failures jsonb;
