#!/usr/bin/env bash
# Regenerates the committed Python code of protos/ into tooltrie/<service>/v1/.
# With --check, generates into a scratch folder and fails when the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=.
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mapfile -t protos < <(find protos -name '*.proto' | sort)
"$python" -m grpc_tools.protoc -I protos --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "${protos[@]}"
for pkg in tooltrie/registry tooltrie/registry/v1 tooltrie/decoder tooltrie/decoder/v1; do
  mkdir -p "$out/$pkg"
  [[ -f "$out/$pkg/__init__.py" ]] || : >"$out/$pkg/__init__.py"
done
if [[ "$out" != "." ]]; then
  for f in $(cd "$out" && find tooltrie -name '*_pb2*.py*' | sort); do
    if ! cmp -s "$out/$f" "$f"; then
      echo "generated code is stale: $f differs from protos/; run scripts/gen_protos.sh and commit" >&2
      exit 1
    fi
  done
  echo "generated protobuf code is fresh"
fi
