"""``python -m worker.app_check MODULE:ATTR``: does the app load? (exit 0, else 2).

The child of the process backend's deploy-time check (``worker/scaler/app_check.py``):
it loads the app as ``lane-worker run --app`` does and says why not as its last line.
"""

from __future__ import annotations

import sys

from worker.app import load_app


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m worker.app_check MODULE:ATTR", file=sys.stderr)
        return 2
    try:
        load_app(argv[0])
    except (ImportError, ValueError) as exc:
        print(f"lane-worker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
