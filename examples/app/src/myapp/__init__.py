"""myapp: an app's plays, run by ``lane-worker run --app myapp.plays:app``."""
