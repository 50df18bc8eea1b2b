-- Drain report and bounded deferral. Additive: builds before this one ignore
-- the new columns.
--
-- The run's current deferral streak: how often it was put back because the
-- loop that claimed it may not run it, and since when. Taking the run over
-- (own or adopt) ends the streak, so the age measures how long it has been
-- waiting for a release that may run it.
alter table {schema}.runs add column defer_count integer not null default 0;
alter table {schema}.runs add column first_deferred_at timestamptz;
-- Set once the streak outlived LANE_WORKER_DEFER_ALERT_AFTER: one warning per streak.
alter table {schema}.runs add column defer_alerted_at timestamptz;

-- Live workers per lane, for the report (the workers table keeps every boot).
create index workers_queue_live_idx on {schema}.workers (queue, heartbeat_at)
  where stopped_at is null;
