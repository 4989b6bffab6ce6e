#!/usr/bin/env bash
# buf lint over protos/ (rules in buf.yaml), with buf from the npm registry, pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null; then
  echo "npm not found: buf lint skipped (install Node.js to run it)" >&2
  exit 0
fi
version=1.75.0
tools=${BUF_TOOLS_DIR:-${TMPDIR:-/tmp}/tooltrie-buf-$version}
if [[ ! -x "$tools/node_modules/.bin/buf" ]]; then
  mkdir -p "$tools"
  npm install --silent --prefix "$tools" "@bufbuild/buf@$version" >/dev/null
fi
"$tools/node_modules/.bin/buf" lint
echo "buf lint: clean"
