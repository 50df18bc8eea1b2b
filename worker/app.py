"""Plays and the app that registers them: ``app = App()``, ``@app.play("name")``."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from worker.run.context import PlayFn

__all__ = ["App", "PlayFn", "load_app"]


class App:
    """A set of plays registered by name: ``@app.play("name")``."""

    def __init__(self) -> None:
        self.plays: dict[str, PlayFn] = {}

    def play(self, name: str) -> Callable[[PlayFn], PlayFn]:
        """Register the decorated async function as play ``name``."""
        if not name or not name.strip():
            raise ValueError("a play needs a non-blank name")

        def register(fn: PlayFn) -> PlayFn:
            if name in self.plays:
                raise ValueError(f"play {name!r} is registered twice")
            self.plays[name] = fn
            return fn

        return register


def load_app(spec: str) -> App:
    """Import ``module:attribute`` and return the ``App`` it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--app must look like package.module:app, got {spec!r}")
    module = importlib.import_module(module_name)
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ValueError(f"{spec} is not a lane-worker App (found {type(app).__name__})")
    return app
