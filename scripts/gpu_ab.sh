#!/usr/bin/env bash
# On a GPU machine, from the repository root: time the decode step of several revisions of the CUDA engine in one
# run (same machine, same minutes), the way docs/cuda-speed-notes.md compares a change with the code before it.
#
#   scripts/gpu_ab.sh REV [REV ...]      git revisions; "." is the working tree as it is; a directory holding
#                                        a source tree (an exported revision with a change applied) runs as it is
#
# Each revision is exported (git archive) under $OUT/trees, its cubin built there, and its own
# bench/gpu_forward.py run for every prompt length, the revisions interleaved round by round. Prints and writes
# ($OUT/ab.md) the step time (graph replay of one unconstrained decode step, Qwen3-1.7B shape), the marginal
# cost of each of the first two layers' launches, and which kernels' machine code differs from the first revision's.
# Environment: OUT (default build/gpu-ab), PROMPTS (default "200 708"), ROUNDS (default 1), ARGS (more
# bench/gpu_forward.py arguments, for example "--weights fp8"), and any TOOLTRIE_* setting, which every revision sees.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/gpu_ab.sh REV|DIR [REV|DIR ...]  (\".\" is the working tree)" >&2; exit 2; }
ROOT=$PWD
OUT="${OUT:-build/gpu-ab}"
PROMPTS="${PROMPTS:-200 708}"
ROUNDS="${ROUNDS:-1}"
PY="${PYTHON:-python3}"
[[ "$PY" == */* ]] && PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # the trees run from their own folders
mkdir -p "$OUT/trees"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d build/gpu_site ] && export PYTHONPATH_SITE="$ROOT/build/gpu_site"

trees=() labels=()
for rev in "$@"; do
  if [ "$rev" = "." ]; then
    trees+=("$ROOT")
    labels+=("working tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- || echo ' with changes')")
  elif [ -d "$rev" ]; then
    [ -f "$rev/cuda/tooltrie.cu" ] || { echo "not a source tree: $rev" >&2; exit 2; }
    trees+=("$(cd "$rev" && pwd)")
    labels+=("$rev")
  else
    name=$(git rev-parse --short "$rev^{commit}") || { echo "not a revision: $rev" >&2; exit 2; }
    tree="$OUT/trees/$name"
    rm -rf "$tree" && mkdir -p "$tree" && git archive "$name" | tar -x -C "$tree" || exit 1
    trees+=("$tree")
    labels+=("$name")
  fi
done

for tree in "${trees[@]}"; do
  (cd "$tree" && PYTHONPATH=. "$PY" -c "from tooltrie.cuda_build import build_cubin; print('built', build_cubin('cuda/build'))") ||
    exit 1
done

for round in $(seq "$ROUNDS"); do
  for prompt in $PROMPTS; do
    for i in "${!trees[@]}"; do
      tree=${trees[$i]}
      extra=()
      grep -q -- "--max-context" "$tree/bench/gpu_forward.py" && extra=(--max-context 1024)
      read -r -a more <<< "${ARGS:-}"
      extra+=("${more[@]}")
      (cd "$tree" && TOOLTRIE_CUBIN=cuda/build/tooltrie.cubin PYTHONPATH=".${PYTHONPATH_SITE:+:$PYTHONPATH_SITE}" \
        "$PY" bench/gpu_forward.py --out "$OUT/ab_${i}_p${prompt}_r${round}.json" --sweeps prefix --tokens 32 \
        --prompt "$prompt" "${extra[@]}" > "$OUT/ab_${i}_p${prompt}_r${round}.log" 2>&1) ||
        { echo "${labels[$i]} failed at prompt $prompt: see $OUT/ab_${i}_p${prompt}_r${round}.log" >&2; exit 1; }
    done
  done
done

# The report compares the revisions' cubins with this checkout's tooltrie.cubin_kernels.
TREES="$(printf '%s\n' "${trees[@]}")" PYTHONPATH="$ROOT" "$PY" - "$OUT" "${labels[@]}" <<'EOF'
import json, os, statistics, sys
from pathlib import Path

from tooltrie.cubin_kernels import compare_cubins

out, labels = Path(sys.argv[1]), sys.argv[2:]
cubins = [Path(tree) / "cuda/build/tooltrie.cubin" for tree in os.environ["TREES"].splitlines()]
runs = {}
for path in sorted(out.glob("ab_*_p*_r*.json")):
    i, prompt = path.stem.split("_")[1], int(path.stem.split("_")[2][1:])
    runs.setdefault((int(i), prompt), []).append(json.loads(path.read_text()))
first = next(iter(runs.values()))[0]
lines = [
    f"# Decode step, same run: {first['device']}, {first['model']}",
    "",
    "Graph replay of one unconstrained step (ms, median over rounds), then each launch's marginal cost in context "
    "(µs, layers 0 and 1, first round).",
    "",
]
for (i, prompt), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    step = statistics.median(r["graph_replay_ms_per_token"] for r in rs)
    prefix = rs[0].get("prefix_marginal_us", [])[1:11]
    cells = ", ".join(f"{p['launch']} {p['us']:.1f}" for p in prefix)
    lines.append(f"- {labels[i]} at {prompt} tokens: {step:.4f} ms ({len(rs)} rounds); {cells}")
lines += ["", f"Machine code against {labels[0]} (`tooltrie cuda compare`):", ""]
for label, cubin in zip(labels[1:], cubins[1:], strict=True):
    changes = compare_cubins(cubins[0], cubin)
    changed = [change.name for change in changes if not change.same]
    same = f"{len(changes) - len(changed)} of {len(changes)} kernels run the same code"
    lines.append(f"- {label}: {same}" + (f"; differ: {', '.join(changed)}" if changed else ""))
text = "\n".join(lines) + "\n"
(out / "ab.md").write_text(text)
print(text)
EOF
