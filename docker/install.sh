#!/bin/sh
# Installs lane-worker and its runtime dependencies exactly as uv.lock pins them into
# /app/.venv (or $1). The Dockerfile runs this, and CI runs it in a clean directory, so
# the image's install steps are exercised on every change.
set -eu
target=${1:-/app/.venv}
uv_version=0.13.9
boot=$(mktemp -d)
python3 -m venv "$boot"
"$boot/bin/pip" install --quiet --no-cache-dir "uv==${uv_version}"
# --no-dev: no test tools; no extras: embedded Postgres is for `lane-worker dev`, not production.
UV_PROJECT_ENVIRONMENT="$target" UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy \
  "$boot/bin/uv" sync --frozen --no-dev --no-editable
rm -rf "$boot"
"$target/bin/lane-worker" --help >/dev/null
