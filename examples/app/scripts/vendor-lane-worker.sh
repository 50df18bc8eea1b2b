#!/bin/sh
# Puts the wheel of the lane-worker release you want into wheels/ and locks it: uv.lock then
# records the wheel's sha256, and an image can only be built from that file. Commit both.
#   git clone --branch <release tag> <lane-worker repository> ../lane-worker
#   sh scripts/vendor-lane-worker.sh ../lane-worker
set -eu
checkout=${1:?usage: sh scripts/vendor-lane-worker.sh PATH/TO/lane-worker-checkout}
cd "$(dirname "$0")/.."
rm -f wheels/lane_worker-*.whl
uv build --wheel --out-dir wheels "$checkout"
# uv marks a folder it creates as ignored by git; this one is meant to be committed.
rm -f wheels/.gitignore
# Only lane-worker moves: every other pin of uv.lock stays as it was.
uv lock --upgrade-package lane-worker
