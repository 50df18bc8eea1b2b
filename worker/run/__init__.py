"""The hot path, in call order: claim, decide, attempt, execute, the play context."""
