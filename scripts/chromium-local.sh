#!/bin/sh
# Chromium for the page's browser tests without root: Debian's chromium package and
# whichever of its libraries this machine lacks, downloaded with `apt-get download`
# (no root needed) and unpacked under $1 (default .tools/chromium) with `dpkg -x`.
# tests/support/page.py runs $1/usr/lib/chromium/chromium with those libraries.
# Needs apt's package lists (an earlier `apt-get update`); says so when they are missing.
set -eu
dest=$(realpath -m "${1:-.tools/chromium}")
if [ -x "$dest/usr/lib/chromium/chromium" ]; then
  exit 0
fi
if ! apt-cache show chromium >/dev/null 2>&1; then
  echo "chromium-local: apt knows no chromium package here (no package lists: \`apt-get update\` needs root)." >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The package and every library it needs that is not installed: what apt would install
# (a simulation needs no root), and the package itself when it is installed system-wide.
{ echo chromium; echo chromium-common
  apt-get install -s -q chromium 2>/dev/null | awk '/^Inst /{print $2}'; } | sort -u > "$work/missing"
echo "chromium-local: downloading $(wc -l < "$work/missing") Debian packages into $dest" >&2
(cd "$work" && xargs apt-get download -q < "$work/missing" >/dev/null)
mkdir -p "$dest"
for deb in "$work"/*.deb; do
  dpkg -x "$deb" "$dest"
done
test -x "$dest/usr/lib/chromium/chromium"
