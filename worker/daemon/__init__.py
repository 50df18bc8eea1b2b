"""The worker process: supervisor, loops, listener, maintenance, health, page."""
