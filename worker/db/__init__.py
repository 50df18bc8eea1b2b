"""The database layer: pool, SQL, the typed store, the engine client, schema."""
