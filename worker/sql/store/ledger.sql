-- Store queries of the ledger relay (worker/db/store/ledger.py): claiming the
-- pending facts of runs that carry a runtime API (migration 0009) and
-- recording what their delivery came to.
-- Each starts with a `-- name: <name>` line and is run by one typed method.

-- name: claim_deliveries
-- Up to $2 due facts for worker $1, leased for $3 seconds, each the earliest
-- pending fact of its run (a run's facts go out in order), none for an
-- endpoint in $4 (those this relay is busy with or backing off from).
with due as (
  select l.fact_id
    from {schema}.ledger l
    join {schema}.run_runtime_api a on a.run_id = l.run_id
   where l.delivery = 'pending'
     and l.next_delivery_at <= now()
     and (l.delivery_claimed_until is null or l.delivery_claimed_until < now())
     -- the endpoint, as the relay's origin_of names it: scheme, host, port
     -- ('' for a context without one, written past the checks: never skipped,
     -- the relay gives its facts up)
     and lower(coalesce(substring(a.api ->> 'baseUrl' from '^(https?://[^/?#]+)'),
                        a.api ->> 'baseUrl', '')) <> all ($4::text[])
     and not exists (select 1 from {schema}.ledger e
                      where e.run_id = l.run_id and e.delivery = 'pending'
                        and e.fact_id < l.fact_id)
   order by l.next_delivery_at, l.fact_id
   limit $2
   for update of l skip locked
)
update {schema}.ledger l
   set delivery_claimed_by = $1,
       delivery_claimed_until = now() + make_interval(secs => $3)
  from due, {schema}.run_runtime_api a
 where l.fact_id = due.fact_id and a.run_id = l.run_id
returning l.fact_id, l.run_id, l.type, l.fact, l.delivery_attempts, l.created_at, a.api;

-- name: delivery_done
-- The endpoint accepted fact $1 (a 2xx): delivered, whoever holds the claim now.
update {schema}.ledger
   set delivery = 'delivered', delivered_at = now(),
       delivery_attempts = delivery_attempts + 1, delivery_error = null,
       delivery_claimed_by = null, delivery_claimed_until = null
 where fact_id = $1 and delivery = 'pending';

-- name: delivery_retry
-- Fact $1 is tried again in $3 seconds ($4: why not now); only while worker $2
-- still holds it. $5: whether this try counts as an attempt (false for a fact
-- put back unsent, its endpoint being backed off from).
update {schema}.ledger
   set delivery_attempts = delivery_attempts + case when $5 then 1 else 0 end,
       next_delivery_at = now() + make_interval(secs => $3),
       delivery_error = coalesce($4, delivery_error),
       delivery_claimed_by = null, delivery_claimed_until = null
 where fact_id = $1 and delivery = 'pending' and delivery_claimed_by = $2;

-- name: delivery_failed
-- Fact $1 is given up ($3: why), while worker $2 holds it.
update {schema}.ledger
   set delivery = 'failed', delivery_attempts = delivery_attempts + 1,
       delivery_error = $3, next_delivery_at = null,
       delivery_claimed_by = null, delivery_claimed_until = null
 where fact_id = $1 and delivery = 'pending' and delivery_claimed_by = $2;

-- name: release_deliveries
-- Worker $1 stops: the facts it still holds are due again at once.
update {schema}.ledger
   set delivery_claimed_by = null, delivery_claimed_until = null
 where delivery = 'pending' and delivery_claimed_by = $1 and fact_id = any ($2::bigint[]);

-- name: delivery_backlog
-- Pending facts: how many, the oldest one's age, and when the next is due
-- (seconds; negative: already due).
select count(*) as pending,
       extract(epoch from now() - min(created_at))::float8 as oldest_s,
       extract(epoch from min(next_delivery_at) - now())::float8 as next_due_s
  from {schema}.ledger
 where delivery = 'pending';
