-- Store queries of sandbox cleanup (worker/db/store/sandboxes.py, migration 0011).
-- Each starts with a `-- name: <name>` line and is run by one typed method.

-- name: register_sandbox
select {schema}.register_sandbox($1, $2);

-- name: cleanup_done
-- The sandbox is deleted (or was gone already).
update {schema}.run_sandboxes
   set cleanup = 'done', cleaned_at = now(), cleanup_attempts = cleanup_attempts + 1,
       cleanup_error = null
 where run_id = $1 and sandbox_id = $2 and cleanup = 'pending';

-- name: cleanup_failed_try
-- One attempt failed ($3: why); $4: it was the last, the cleanup is given up.
update {schema}.run_sandboxes
   set cleanup = case when $4 then 'failed' else cleanup end,
       cleanup_attempts = cleanup_attempts + 1, cleanup_error = $3
 where run_id = $1 and sandbox_id = $2 and cleanup = 'pending';

-- name: cleanup_counts
-- Per lane: cleanups waiting, and the given-up ones with their sandboxes.
-- Store migration 0049: with the owner's rights (a viewer reads no sandbox table).
select * from {schema}.report_cleanups_v1();
