"""The basic plays under another app spec: a second "image" of one release (process backend)."""

from support.apps.basic import app

__all__ = ["app"]
