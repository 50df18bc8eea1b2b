"""Settings, tuning and the database URL, parsed once per process."""
