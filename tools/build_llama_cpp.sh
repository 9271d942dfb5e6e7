#!/usr/bin/env bash
# Build the llama.cpp oracle (llama-cpp-python from its source distribution, CPU only) into a venv
# OUTSIDE the repo, and unpack the same sdist's sources (ggml's C code, read by oracle scripts).
# Used by golden/oracle/*/make_oracle.py through ctypes on libggml. ~6 min on 2 idle cores (40 min when
# the machine is shared).
# Usage: tools/build_llama_cpp.sh [VENV_DIR] [SRC_DIR]   (defaults ./.llama-venv, ./.llama-src)
# On success touches $VENV/READY (other scripts wait on that file).
# Libraries: $VENV/lib/python3.11/site-packages/llama_cpp/lib/{libggml-base,libggml-cpu,libggml,libllama}.so
set -euo pipefail
VENV="${1:-.llama-venv}"
SRC="${2:-.llama-src}"
VERSION=0.3.36   # the version the committed oracle fixtures were made with
python3 -m venv "$VENV"
"$VENV/bin/pip" install numpy gguf
CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF" \
    "$VENV/bin/pip" install --no-binary :all: "llama-cpp-python==$VERSION"
mkdir -p "$SRC"
"$VENV/bin/pip" download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$SRC"
tar xzf "$SRC/llama_cpp_python-$VERSION.tar.gz" -C "$SRC"
find "$VENV" -name 'libggml*.so' -print
touch "$VENV/READY"
