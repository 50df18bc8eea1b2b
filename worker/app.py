"""Plays and the app that registers them: ``app = App()``, ``@app.play("name")``."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
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
    """Import ``module:attribute`` and return the ``App`` it names.

    Modules are found in the current directory too (as uvicorn and celery do). An
    error raised while the module is imported is printed with its traceback on
    stderr (it is the user's code), then reported as an ``ImportError``.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--app must look like package.module:app, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ImportError(
                f"no module {exc.name!r} (looked in the current directory {cwd} and on "
                "sys.path; set PYTHONPATH or run from the project's directory)"
            ) from exc
        traceback.print_exc(file=sys.stderr)
        raise ImportError(f"importing {module_name} failed: {exc} (traceback above)") from exc
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        raise ImportError(
            f"importing {module_name} raised {type(exc).__name__}: {exc} (traceback above)"
        ) from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ValueError(f"{spec} is not a lane-worker App (found {type(app).__name__})")
    return app
