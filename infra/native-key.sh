#!/usr/bin/env bash
# Prints the key of a native addon build: a SHA-256 over everything the build's output depends on — every source
# and build file under native/ (native/build excluded), the compilers' versions, Node's ABI, the installed
# node-addon-api and node-gyp, and RLSTREAM_CUDA/CUDA_HOME. A build whose key is in the per-user cache
# (${RLSTREAM_CACHE_DIR:-~/.cache/rlstream}/native/<key>/) is the same build, so infra/setup.sh and
# test/native/cuda-build.test.ts copy it from there instead of compiling again (ccache's idea, for one binary):
# a clean clone on a warm machine skips 30-100 s of compiling; any changed byte misses.
# Usage: bash infra/native-key.sh [repo root]   (RLSTREAM_CUDA=1 CUDA_HOME=… for the CUDA build's key; NODE=… a node
# binary not on PATH)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
{
  find native -path native/build -prune -o -path native/node_modules -prune -o -type f \
    \( -name '*.cc' -o -name '*.cpp' -o -name '*.c' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.gyp' -o -name '*.gypi' \) -print |
    LC_ALL=C sort | while read -r f; do printf '%s ' "$f"; sha256sum <"$f"; done
  echo "node $(${NODE:-node} -p 'process.versions.node + " abi " + process.versions.modules + " " + process.arch')"
  echo "c++ $(${CXX:-c++} --version 2>/dev/null | head -n1)"
  for p in node-addon-api node-gyp; do echo "$p $(${NODE:-node} -p "require('./node_modules/$p/package.json').version" 2>/dev/null || echo none)"; done
  echo "cuda ${RLSTREAM_CUDA:-0} ${CUDA_HOME:-}"
  if [ "${RLSTREAM_CUDA:-0}" = 1 ]; then "${CUDA_HOME:-/usr}/bin/nvcc" --version 2>/dev/null | tail -n2; fi
} | sha256sum | cut -c1-32
