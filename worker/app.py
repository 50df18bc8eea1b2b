"""Plays and the app that registers them: ``app = App()``, ``@app.play("name")``."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from types import ModuleType

from worker.run.context import PlayFn

__all__ = ["App", "PlayFn", "PlayRegistrationError", "load_app"]


def _is_async(fn: object) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def``, wrapped or bound or not.

    A decorator's wrapper counts by what it wraps (``functools.wraps``), and an
    object by its ``__call__``; ``functools.partial`` and methods ``inspect`` sees through.
    """
    target = inspect.unwrap(fn) if callable(fn) else fn
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(target):
        return True
    if inspect.isroutine(fn) or not callable(fn):
        return False
    return inspect.iscoroutinefunction(type(fn).__call__)


def _described(fn: object) -> str:
    """Name what was registered as a play, for the refusal: ``a plain function greet at
    acme/plays.py line 7``."""
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return f"a plain function {fn.__qualname__}{_where(fn)}"
    return f"a {type(fn).__name__} object"


def _where(fn: object) -> str:
    """`` at FILE line N`` of a function's ``def`` (relative to the current directory when
    under it), or nothing when it cannot be told."""
    code = getattr(inspect.unwrap(fn), "__code__", None)  # type: ignore[arg-type]
    if code is None or not code.co_filename or code.co_filename.startswith("<"):
        return ""
    path = code.co_filename
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        relative = path
    shown = path if relative.startswith("..") else relative
    return f" at {shown} line {code.co_firstlineno}"


class PlayRegistrationError(TypeError, ValueError):
    """``@app.play`` refused a play (not ``async def``, a blank or repeated name).

    Raised while the app's module is imported: ``load_app`` says it in one line, with
    the play's file and line, and no traceback (the sentence says all there is). A
    ``TypeError`` and a ``ValueError`` both, as the refusals were before.
    """


class App:
    """A set of plays registered by name: ``@app.play("name")``."""

    def __init__(self) -> None:
        self.plays: dict[str, PlayFn] = {}

    def play(self, name: str) -> Callable[[PlayFn], PlayFn]:
        """Register the decorated ``async def`` function as play ``name``.

        A plain ``def`` is refused here, at import: awaiting what it returns would
        fail only once a run reached it, after its body had already run. (A step's
        function may be plain: ``ctx.step`` runs it in a thread.)
        """
        if not name or not name.strip():
            raise PlayRegistrationError("a play needs a non-blank name")

        def register(fn: PlayFn) -> PlayFn:
            if not _is_async(fn):
                raise PlayRegistrationError(
                    f"play {name!r}: plays must be async def (got {_described(fn)}); "
                    "write it as `async def ...(ctx, params)`"
                )
            if name in self.plays:
                raise PlayRegistrationError(
                    f"play {name!r} is registered twice{_where(fn)}: each name once"
                )
            self.plays[name] = fn
            return fn

        return register


def _apps_in(module: ModuleType) -> str:
    """Say which ``App`` objects ``module`` has at its top level, for a wrong attribute."""
    names = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if not names:
        return "it has no App object (make one with `app = App()`)"
    return "it has App objects: " + ", ".join(names)


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
    except PlayRegistrationError as exc:
        # The sentence names the play, the rule and where: a traceback adds only noise.
        raise ImportError(f"importing {module_name}: {exc}") from exc
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
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name} has no attribute {attr!r}; {_apps_in(module)}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ValueError(
            f"{spec} is not a lane-worker App (found {type(app).__name__}); {_apps_in(module)}"
        )
    return app
