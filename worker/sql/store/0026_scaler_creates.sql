-- The scaler's creates, remembered in the store (issue 34 item 3, attack34 A7).
-- The scaler bounds what it creates for a release by what it created and the
-- backend does not list yet (plan.py: the unlisted bound, MADE_SURPLUS). Kept
-- in the process only, that memory was forgotten each time a scaler became
-- active (a lost lock regained, a restart, a standby taking over): with a
-- listing that drops the scaler's metadata, six activations made six machines
-- for a release of one. A row is written before the create is sent (a scaler
-- cut off mid-create still counts it), given the machine's id when the backend
-- answers, removed when the backend refuses the create, marked listed once the
-- backend lists the machine and removed when it no longer does; a scaler that
-- becomes active loads the rows (worker/scaler/reconcile.py). Unlisted rows are
-- forgotten after a bounded age (worker/scaler/observe.py's CREATE_MEMORY_S;
-- without a machine id, UNLISTED_AFTER_S), and with their release once the
-- registry no longer has it. The table is the store's, so it holds only this
-- store's machines (no store id column). Older builds never read or write it.
create table {schema}.scaler_creates (
  -- The scaler's own key of the create (a random token), known before it is sent.
  create_key text primary key check (char_length(create_key) between 1 and 200),
  release_id text not null,
  image text not null,
  -- The backend's machine id, once the create answered with it.
  machine_id text,
  -- Once the backend listed the machine (it then counts while listed).
  listed boolean not null default false,
  sent_at timestamptz not null default now()
);
create index scaler_creates_machine_idx on {schema}.scaler_creates (machine_id);
