#!/usr/bin/env bash
# Build the llama.cpp oracle (llama-cpp-python from its source distribution, CPU only) into a venv
# OUTSIDE the repo. Used by golden/oracle/*/make_oracle.py scripts via ctypes on libggml.
# Usage: tools/build_llama_cpp.sh [VENV_DIR]   (default /work/llama-venv; ~6 min on 2 cores)
# On success touches $VENV/READY (other scripts wait on that file).
set -euo pipefail
VENV="${1:-/work/llama-venv}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install numpy gguf
CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF" \
    "$VENV/bin/pip" install --no-binary :all: llama-cpp-python
# The shared libraries land in site-packages/llama_cpp/lib (libggml-base.so, libggml-cpu.so, libggml.so, libllama.so).
find "$VENV" -name 'libggml*.so*' -print
touch "$VENV/READY"
