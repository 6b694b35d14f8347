#!/usr/bin/env bash
# Brings the Node side of the native core to a GPU machine that has nvcc, g++, make and python3 but no Node, no
# OpenBLAS and no network, the way a user would: `pack` (here, where `npm ci` ran) writes one xz archive of what
# that machine lacks; `build` (there) unpacks it and builds the addon with the project's own build (node-gyp,
# RLSTREAM_CUDA=1); `test` (there) runs the native core's Node tests against that build.
#   bash test/gpu/pack-node.sh pack [DIR]           # DIR default .node-pack (gitignored): rlstream-node.tar.xz
#   bash test/gpu/pack-node.sh pack-run [DIR]       # + rlstream-run.tar.xz: the npm modules a run loads (for `run`)
#   bash test/gpu/pack-node.sh build [DIR]          # unpack to $RLSTREAM_NODE_HOME (default /tmp/rlstream-node), build
#   bash test/gpu/pack-node.sh test [DIR] [FILES…]   # default: test/native/*.test.ts (not without-addon) + test/gpu/*.test.ts
#   bash test/gpu/pack-node.sh run [DIR] [CONFIG] [ARGS…]  # rlstream run CONFIG (default examples/calculator/config.gpu.yaml)
#   bash test/gpu/pack-node.sh cli DIR ARGS…       # rlstream ARGS… (any command, e.g. import gguf)
# The archive holds: the node binary and its headers (include/node, without OpenSSL's, which no N-API addon
# includes), OpenBLAS with its Fortran runtime and zlib's link name (the addon's CPU path links them), and the
# node_modules closure of node-gyp, node-addon-api and tsx (the native tests import nothing else from npm;
# test/gpu/trainer-device.test.ts runs the trainer and the main job, so it needs the modules of `pack-run`).
# test/native/without-addon.test.ts is left out by default: it runs the log and trace-sink tests on their JS
# paths, which need chDB's 540 MB engine and touch neither the addon nor the GPU.
# `pack-run` adds what `rlstream run` loads from npm, found by running it: a short CPU run of the config under
# strace records every file the process and its worker threads open under node_modules (onnxruntime-node's
# linux-x64 CPU library included, its other platforms not); chDB's engine is not among them, so the config must
# not use traces.kind: chdb (examples/calculator/config.gpu.yaml uses none).
set -euo pipefail
cd "$(dirname "$0")/../.."
step=${1:-}
dir=${2:-.node-pack}
stage=
home=${RLSTREAM_NODE_HOME:-/tmp/rlstream-node}
archive="$dir/rlstream-node.tar.xz"
run_archive="$dir/rlstream-run.tar.xz"
run_config=examples/calculator/config.gpu.yaml

pack() {
  command -v node >/dev/null || { echo "pack: needs node (and npm ci done) on this machine" >&2; exit 1; }
  [ -d node_modules/node-gyp ] && [ -d node_modules/tsx ] || { echo "pack: run npm ci first" >&2; exit 1; }
  local node_bin prefix blas
  node_bin=$(readlink -f "$(command -v node)")
  prefix=$(dirname "$(dirname "$node_bin")")
  [ -f "$prefix/include/node/node_api.h" ] || { echo "pack: no node headers under $prefix/include/node" >&2; exit 1; }
  blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0 2>/dev/null || true)
  [ -n "$blas" ] && [ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] ||
    { echo "pack: needs libopenblas-dev here (infra/setup.sh installs it)" >&2; exit 1; }
  stage=$(mktemp -d)
  trap '[ -z "$stage" ] || rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/include" "$stage/lib" "$stage/include/openblas" "$stage/node_modules"
  cp "$node_bin" "$stage/bin/node"
  tar -C "$prefix/include" --exclude=node/openssl -cf - node | tar -C "$stage/include" -xf -
  cp /usr/include/x86_64-linux-gnu/openblas-pthread/*.h "$stage/include/openblas/"
  cp "$blas" "$stage/lib/libopenblas.so.0"
  ln -s libopenblas.so.0 "$stage/lib/libopenblas.so"
  for l in libgfortran.so.5 libquadmath.so.0; do cp "$(readlink -f "/lib/x86_64-linux-gnu/$l")" "$stage/lib/$l"; done
  cp "$(readlink -f /lib/x86_64-linux-gnu/libz.so.1)" "$stage/lib/libz.so.1"
  ln -s libz.so.1 "$stage/lib/libz.so"
  # The packages' closure as npm installed it (package-lock.json's hoisted layout), so nested versions stay nested.
  node -e '
    const lock = require("./package-lock.json").packages;
    const seen = new Set();
    const visit = (from, name) => {
      for (let base = from; ; base = base.replace(/\/?node_modules\/(@[^/]+\/)?[^/]+$/, "")) {
        const key = (base ? base + "/" : "") + "node_modules/" + name;
        if (lock[key]) {
          if (seen.has(key)) return;
          seen.add(key);
          const p = lock[key];
          for (const d of Object.keys({ ...p.dependencies, ...p.optionalDependencies })) visit(key, d);
          return;
        }
        if (!base) return; // an optional dependency for another platform
      }
    };
    for (const n of ["node-gyp", "node-addon-api", "tsx"]) visit("", n);
    console.log([...seen].filter((k) => require("fs").existsSync(k)).sort().join("\n"));
  ' >"$stage/modules.txt"
  tar -cf - -T "$stage/modules.txt" | tar -C "$stage" -xf -
  mkdir -p "$dir"
  tar -C "$stage" -cf - bin include lib node_modules | xz -6 -T0 >"$archive.tmp"
  mv "$archive.tmp" "$archive"
  echo "pack: $archive ($(du -h "$archive" | cut -f1); node $(node -v), $(wc -l <"$stage/modules.txt") packages)"
}

pack_run() {
  command -v strace >/dev/null || { echo "pack-run: needs strace here (apt-get install strace)" >&2; exit 1; }
  [ -f native/build/Release/rlstream_native.node ] || { echo "pack-run: build the addon here first (npm run build:native)" >&2; exit 1; }
  if [ ! -f "$archive" ]; then pack && rm -rf "$stage"; fi
  local trace data list
  stage=$(mktemp -d)
  trap '[ -z "$stage" ] || rm -rf "$stage"' EXIT
  trace="$stage/strace.txt" data="$stage/data" list="$stage/files.txt"
  # The same config with the trainer on the CPU (this machine has no GPU), a few steps and evaluations: every
  # phase of the main job runs, so every module it imports is opened. The example's small model and its shipped
  # warm start keep it short (SFT, which a missing model.init runs, loads no npm module of its own).
  strace -f -qq -e trace=openat -o "$trace" node --import tsx cli/main.ts run "$run_config" \
    --set trainer.device=cpu --set model.config=model.json --set model.init=checkpoints/sft \
    --set trainer.max_steps=2 --set eval.every_steps=1 --set task.heldout_problems=8 \
    --set rollout.concurrency=16 --set run.data_dir="$data" >"$stage/run.out" 2>&1 ||
    { tail -20 "$stage/run.out" >&2; echo "pack-run: the traced run failed" >&2; exit 1; }
  # node_modules may be a link (a git worktree sharing another checkout's): the process opens the files at the
  # link's target, so both spellings are matched and the files are read from the target's parent
  local real
  real=$(readlink -f node_modules)
  grep -v ENOENT "$trace" | grep -oE "\"($PWD/node_modules|$real)/[^\"]*\"" | tr -d '"' |
    sed -e "s#^$PWD/##" -e "s#^$(dirname "$real")/##" | sort -u |
    while read -r f; do [ -f "$(dirname "$real")/$f" ] && echo "$f"; done >"$list"
  grep -q onnxruntime_binding.node "$list" || { echo "pack-run: the traced run did not load onnxruntime-node" >&2; exit 1; }
  tar -C "$(dirname "$real")" -cf - -T "$list" | xz -6 -T0 >"$run_archive.tmp"
  mv "$run_archive.tmp" "$run_archive"
  echo "pack-run: $run_archive ($(du -h "$run_archive" | cut -f1); $(wc -l <"$list") files of $(cut -d/ -f2 "$list" | sort -u | wc -l) package scopes/names; with $(du -h "$archive" | cut -f1) of $archive)"
}

# Environment for building and running against the unpacked archive.
use() {
  [ -x "$home/bin/node" ] || { echo "$step: nothing unpacked at $home (run build first)" >&2; exit 1; }
  export PATH="$home/bin:$PATH"
  export CPATH="$home/include/openblas${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$home/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The modules live in the archive; the repository resolves them through its own node_modules, as after npm ci.
  if [ ! -e node_modules ]; then ln -s "$home/node_modules" node_modules; fi
}

build() {
  [ -f "$archive" ] || { echo "build: no $archive (run pack on a machine with Node and carry $dir)" >&2; exit 1; }
  rm -rf "$home" && mkdir -p "$home"
  xz -dc "$archive" | tar -C "$home" -xf -
  if [ -f "$run_archive" ]; then xz -dc "$run_archive" | tar -C "$home" -xf -; fi
  use
  if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    export CUDA_HOME
  fi
  echo "build: node $(node -v), CUDA_HOME=${CUDA_HOME:-none}, RLSTREAM_CUDA=${RLSTREAM_CUDA:-1}"
  # = npm run build:native, with the headers from the archive instead of npm's nodedir setting
  RLSTREAM_CUDA=${RLSTREAM_CUDA:-1} node node_modules/node-gyp/bin/node-gyp.js rebuild --directory native --nodedir="$home" --jobs="$(nproc)"
  node --import tsx -e "import { nativeAvailable, cudaAvailable } from './native/index.ts'; console.log('build: nativeAvailable', nativeAvailable(), 'cudaAvailable', cudaAvailable())"
}

run_tests() {
  use
  shift
  [ $# -gt 0 ] && shift
  local files=("$@")
  if [ ${#files[@]} -eq 0 ]; then
    for f in test/native/*.test.ts test/gpu/*.test.ts; do
      [ "$f" = test/native/without-addon.test.ts ] && continue
      if [ "$f" = test/gpu/trainer-device.test.ts ] && [ ! -f "$home/node_modules/onnxruntime-node/package.json" ]; then
        echo "test: $f left out (no run modules in $home: pack-run here, carry $dir, then build)"
        continue
      fi
      files+=("$f")
    done
  fi
  node --import tsx --test --test-concurrency=1 "${files[@]}"
}

# The CLI on the unpacked modules and the addon `build` made: `rlstream ARGS…`.
run_cli() {
  use
  [ -f "$home/node_modules/onnxruntime-node/package.json" ] || { echo "$step: no run modules in $home (pack-run here, carry $dir, then build)" >&2; exit 1; }
  node --import tsx cli/main.ts "$@"
}

# The main job: `rlstream run CONFIG ARGS…` (its JSON line on stdout).
run_main() {
  shift
  [ $# -gt 0 ] && shift
  local config=${1:-$run_config}
  [ $# -gt 0 ] && shift
  run_cli run "$config" "$@"
}

case "$step" in
  pack) pack ;;
  pack-run) pack_run ;;
  build) build ;;
  test) run_tests "$@" ;;
  run) run_main "$@" ;;
  cli) shift; [ $# -gt 0 ] && shift; run_cli "$@" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
