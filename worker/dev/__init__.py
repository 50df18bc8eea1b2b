"""`lane-worker dev`: embedded Postgres, a worker and the demo runs."""
