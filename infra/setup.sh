#!/usr/bin/env bash
# One-time, idempotent installation of everything rlstream needs on this machine. Safe to run repeatedly:
# each step checks whether its result is already there and prints nothing when it is. Installs:
#   npm packages (npm ci when the lockfile changed), Debian packages (Java, Maven, ClickHouse, chromium, kcat,
#   OpenBLAS; nvcc for the CUDA layer's build check), the native core build, Kafka's jars and the schema registry
#   (Apicurio) through Maven, librdkafka's Node binding built from source (for `log.client: librdkafka`), and
#   llama.cpp's server with a small model (infra/llama-server.sh).
# Everything downloaded lives under .infra/ (gitignored) or ~/.m2.
# `--embedded` installs only what the embedded default needs (npm packages, OpenBLAS, the native core):
# that is what `npm start` runs; the test suite runs the full setup. `--kafka-native` builds only librdkafka's
# Node binding (what `log.client: librdkafka` needs).
set -euo pipefail
cd "$(dirname "$0")/.."
embedded_only=false
kafka_native_only=false
if [ "${1:-}" = "--embedded" ]; then embedded_only=true; fi
if [ "${1:-}" = "--kafka-native" ]; then kafka_native_only=true; fi
source infra/env.sh
D="$RLSTREAM_INFRA_DIR"
mkdir -p "$D"

say() { echo "setup: $*" >&2; }
started=$(date +%s)
# A step that takes minutes says what it is doing before it starts, and how long it took when it is done.
step_started=0
step() { say "$* …"; step_started=$(date +%s); }
step_done() { say "  done in $(($(date +%s) - step_started))s"; }
# onnxruntime-node's postinstall downloads CUDA libraries from a host this machine cannot reach; its CPU build
# is bundled and is all rlstream uses. The package reads this variable (an .npmrc key of the same name works
# too, but npm warns about it on every command).
export ONNXRUNTIME_NODE_INSTALL=skip
# Maven's output goes to a log, shown only when it fails (even -q prints colour codes).
mvn_quiet() {
  mvn -q -B "$@" >"$D/maven.log" 2>&1 || { cat "$D/maven.log" >&2; return 1; }
}

# --- Debian packages: only those missing, one apt-get update for all of them.
sudo_cmd=()
if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi
# package:command — a package counts as present when its command is on PATH (Java or Maven may come from
# elsewhere than Debian), or, without a command, when dpkg knows it.
packages=(default-jre-headless:java maven:mvn libopenblas-dev: zlib1g-dev: libssl-dev: clickhouse-server:clickhouse-server
  clickhouse-client:clickhouse-client chromium:chromium kcat:kcat curl:curl cmake:cmake g++:g++ make:make bubblewrap:bwrap)
if $embedded_only; then packages=(libopenblas-dev: zlib1g-dev: bubblewrap:bwrap); fi
if $kafka_native_only; then packages=(zlib1g-dev: libssl-dev: g++:g++ make:make python3:python3); fi
missing=()
for entry in "${packages[@]}"; do
  p=${entry%%:*} c=${entry#*:}
  if [ -n "$c" ]; then command -v "$c" >/dev/null 2>&1 && continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  # clickhouse-server's postinst may try to start a service; without systemd that fails harmlessly.
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  step_done
fi

# --- npm packages: `npm ci` when the lockfile changed since the last install, or linked from the per-user cache
# after a check of every file (infra/npm-packages.sh says how and why).
# npm skips an optional dependency it fails to unpack and still exits 0; chDB's native library is one, and
# without it the embedded trace store cannot open. Seen when the disk was full (ENOSPC while unpacking). Checked
# before the packages are kept in the cache.
npm_after_install() {
  if ! node -e "import('chdb').then(() => process.exit(0), () => process.exit(1))" 2>/dev/null; then
    say "chDB's native library did not install (npm skips an optional package it cannot unpack: disk full? $(df -h . | awk 'NR==2 {print $4}') free here; npm's debug log in ~/.npm/_logs has the reason)"
    exit 1
  fi
}
source infra/npm-packages.sh
npm_packages

# --- native core: rebuild when a source is newer than the built addon; the same sources built before on this
# machine (infra/native-key.sh) are copied from the per-user cache instead.
if [ -f native/binding.gyp ]; then
  addon=$(ls native/build/Release/*.node 2>/dev/null | head -n1 || true)
  if [ -z "$addon" ] || [ -n "$(find native -path native/build -prune -o -type f \( -name '*.cc' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name 'binding.gyp' \) -newer "$addon" -print -quit)" ]; then
    key=$(bash infra/native-key.sh)
    cached="${RLSTREAM_CACHE_DIR:-$HOME/.cache/rlstream}/native/$key/rlstream_native.node"
    if [ -f "$cached" ]; then
      step "copying the native core built from these same sources from $(dirname "$cached")"
      mkdir -p native/build/Release && cp "$cached" native/build/Release/rlstream_native.node
    else
      step "building the native core (C++, about 1 minute on 2 cores, log in $D/native-build.log)"
      npm run --silent build:native >"$D/native-build.log" 2>&1 || { cat "$D/native-build.log" >&2; exit 1; }
      # (the cache is a convenience: a full disk must not fail the setup)
      { mkdir -p "$(dirname "$cached")" && cp native/build/Release/rlstream_native.node "$cached.tmp" && mv "$cached.tmp" "$cached"; } || true
    fi
    step_done
  fi
fi

if $embedded_only; then exit 0; fi

# --- nvcc, for the build check of the native core's CUDA layer (test/native/cuda-build.test.ts): no GPU here, but
# the CUDA build must still compile, link and load. A CUDA install already present (CUDA_HOME, /usr/local/cuda,
# nvcc on PATH) is used; else Debian's nvidia-cuda-toolkit (CUDA 11.8, which compiles for sm_90), from Debian's
# non-free component of this release, added for it when the sources lack it (about 1.6 GB to download; the install
# took about 90 s here).
if ! { [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; } && [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then
  step "installing Debian's nvidia-cuda-toolkit (nvcc for the CUDA layer's build check; about 1.6 GB, log in $D/cuda-toolkit.log)"
  {
    if ! apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")" |
        "${sudo_cmd[@]}" tee /etc/apt/sources.list.d/rlstream-cuda-toolkit.sources >/dev/null
      "${sudo_cmd[@]}" apt-get update -qq
    fi
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit
  } >"$D/cuda-toolkit.log" 2>&1 || say "WARNING: nvidia-cuda-toolkit did not install (see $D/cuda-toolkit.log): the CUDA layer's build check cannot run"
  step_done
fi

# --- librdkafka's Node binding (@confluentinc/kafka-javascript), for `log.client: librdkafka`. Not an npm
# dependency: its install script downloads a prebuilt binary from GitHub, then builds librdkafka from source,
# which would make every `npm ci` slow or fail. Built once into its own directory per version and loaded from
# there (core/log/kafka/librdkafka/binding.ts). npm_config_build_from_source skips the download; CKJS_LINKING=
# dynamic links librdkafka against this machine's OpenSSL and zlib (the static build downloads their sources).
# Its librdkafka build runs `make -j` without a limit, hence nice. Sources and static libraries are removed
# afterwards (290 MB to about 20 MB): only the addon and librdkafka's shared libraries are loaded.
# A fresh clone has an empty .infra/: the built binding is also kept in the per-user cache, as llama.cpp's server is
# (infra/llama-server.sh), so that each clone on this machine copies it instead of building it again.
# librdkafka and the binding are built with the patches in infra/kafka-native/ (each says what it changes and why:
# binding-*.patch apply to the package, the others to its bundled librdkafka); .complete holds the checksum of
# their diffs (not of the prose above them), so a changed or added patch rebuilds it.
kjs="$D/kafka-javascript/$KAFKA_JAVASCRIPT_VERSION"
kjs_cache="${RLSTREAM_CACHE_DIR:-$HOME/.cache/rlstream}/kafka-javascript/$KAFKA_JAVASCRIPT_VERSION"
kjs_patches=()
for p in "$PWD"/infra/kafka-native/*.patch; do [ -f "$p" ] && kjs_patches+=("$p"); done  # none: a stock build
kjs_stamp="patches $(for p in "${kjs_patches[@]}"; do sed -n '/^--- /,$p' "$p"; done | sha256sum | cut -c1-16)"
kjs_built() { [ -f "$1/.complete" ] && [ "$(cat "$1/.complete")" = "$kjs_stamp" ]; }
if ! kjs_built "$kjs" && kjs_built "$kjs_cache"; then
  step "copying librdkafka's Node binding $KAFKA_JAVASCRIPT_VERSION from $kjs_cache"
  rm -rf "$kjs" && mkdir -p "$(dirname "$kjs")" && cp -a "$kjs_cache" "$kjs" &&
    node -e 'require(process.argv[1])' "$kjs/node_modules/@confluentinc/kafka-javascript" 2>/dev/null || rm -rf "$kjs"
  step_done
fi
if ! kjs_built "$kjs"; then
  step "building librdkafka and @confluentinc/kafka-javascript $KAFKA_JAVASCRIPT_VERSION from source, with ${#kjs_patches[@]} patch(es) from infra/kafka-native/ (about 5 minutes on 2 busy cores, log in $D/kafka-javascript.log)"
  rm -rf "$kjs"
  mkdir -p "$kjs/src"
  echo '{ "name": "rlstream-kafka-native", "private": true }' >"$kjs/package.json"
  # The package's tarball, unpacked, patched and packed again (npm installs a folder as a link, a tarball as a copy).
  if (cd "$kjs" && npm pack --silent "@confluentinc/kafka-javascript@$KAFKA_JAVASCRIPT_VERSION" >pack.name &&
    tar -xzf "$(cat pack.name)" -C src && rm "$(cat pack.name)" &&
    for p in "${kjs_patches[@]}"; do
      case "$(basename "$p")" in binding-*) at=src/package ;; *) at=src/package/deps/librdkafka ;; esac
      patch -s -p1 -d "$at" <"$p" || exit 1
    done &&
    tar -czf patched.tgz -C src package && rm -rf src pack.name &&
    npm_config_build_from_source=true CKJS_LINKING=dynamic nice -n 10 \
      npm install --no-audit --no-fund --no-save --no-package-lock --loglevel=error ./patched.tgz && rm patched.tgz) >"$D/kafka-javascript.log" 2>&1 &&
    node -e 'const k = require(process.argv[1]); if (!k.features.includes("ssl")) throw new Error("built without TLS (libssl-dev missing?)")' "$kjs/node_modules/@confluentinc/kafka-javascript" >>"$D/kafka-javascript.log" 2>&1; then
    pkg="$kjs/node_modules/@confluentinc/kafka-javascript"
    rm -rf "$pkg/deps/librdkafka" "$pkg/build/deps/include" "$pkg/build/deps/pkgconfig" "$pkg/build/Release/obj.target" "$pkg/build/Release/.deps"
    rm -f "$pkg"/build/deps/*.a
    strip --strip-unneeded "$pkg"/build/deps/*.so.1 "$pkg"/build/Release/*.node 2>/dev/null || true
    node -e 'require(process.argv[1])' "$pkg"
    echo "$kjs_stamp" >"$kjs/.complete"
    { rm -rf "$kjs_cache" && mkdir -p "$(dirname "$kjs_cache")" && cp -a "$kjs" "$kjs_cache"; } || true
    step_done
  else
    tail -n 30 "$D/kafka-javascript.log" >&2
    say "WARNING: librdkafka's Node binding did not build (see $D/kafka-javascript.log): log.client: librdkafka is unavailable, and its tests will be skipped"
    rm -rf "$kjs"
    if $kafka_native_only; then exit 1; fi
  fi
fi
if $kafka_native_only; then exit 0; fi

# --- Kafka: the official jars from Maven Central, one directory per version (so 3.9 and 4.x can coexist).
kafka_libs="$D/kafka/$KAFKA_VERSION/libs"
if [ ! -f "$kafka_libs/.complete" ]; then
  step "resolving Kafka $KAFKA_VERSION from Maven Central"
  rm -rf "$kafka_libs"
  mvn_quiet -f infra/kafka/pom.xml -Dkafka.version="$KAFKA_VERSION" dependency:copy-dependencies \
    -DincludeScope=runtime -DexcludeArtifactIds=slf4j-reload4j,reload4j -DoutputDirectory="$kafka_libs"
  # Keep the log4j binding that matches the slf4j API this Kafka line brings (both define the same classes).
  if ls "$kafka_libs"/slf4j-api-2.* >/dev/null 2>&1; then rm -f "$kafka_libs"/log4j-slf4j-impl-*.jar; else rm -f "$kafka_libs"/log4j-slf4j2-impl-*.jar; fi
  touch "$kafka_libs/.complete"
  step_done
fi

# --- Schema registry: Apicurio's runnable distribution, unpacked.
reg="$D/registry/$APICURIO_VERSION"
if [ ! -f "$reg/.complete" ]; then
  step "resolving Apicurio Registry $APICURIO_VERSION from Maven Central"
  rm -rf "$reg" "$D/registry/download"
  mvn_quiet -f infra/registry/pom.xml -Dapicurio.version="$APICURIO_VERSION" -DoutputDirectory="$D/registry/download" \
    dependency:copy
  mkdir -p "$reg"
  tar -xzf "$D/registry/download/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz" -C "$reg"
  rm -rf "$D/registry/download"
  touch "$reg/.complete"
  step_done
fi

# A virtual environment $D/NAME with pip's PACKAGES, made by PYTHON, unless its python already imports IMPORTS.
# Without python3, or when pip fails (the half-made environment is then removed), it says which TESTS go without.
# Usage: python_venv NAME PYTHON IMPORTS TESTS PACKAGES...
python_venv() {
  local name=$1 python=$2 imports=$3 tests=$4
  shift 4
  if [ -x "$D/$name/bin/python" ] && "$D/$name/bin/python" -c "import $imports" >/dev/null 2>&1; then return; fi
  if ! command -v python3 >/dev/null 2>&1; then
    say "WARNING: no python3: $tests will be skipped"
    return
  fi
  # The environment itself lives in the per-user cache, keyed by its python and its packages, and $D/NAME links to
  # it: a fresh clone on a machine that made it before skips pip (about 90 s for the three below).
  local key cache
  key=$({ "$python" --version 2>&1; printf '%s\n' "$name" "$@"; } | sha256sum | cut -c1-16)
  cache="${RLSTREAM_CACHE_DIR:-$HOME/.cache/rlstream}/venv/$name-$key"
  if ! { [ -x "$cache/bin/python" ] && "$cache/bin/python" -c "import $imports" >/dev/null 2>&1; }; then
    step "installing $* into $cache (pip, log in $D/$name.log)"
    rm -rf "$cache" && mkdir -p "$(dirname "$cache")"
    if ! { "$python" -m venv "$cache" && "$cache/bin/pip" install -q "$@"; } >"$D/$name.log" 2>&1; then
      say "WARNING: $* did not install (see $D/$name.log): $tests cannot run"
      rm -rf "$cache" "${D:?}/$name"
      step_done
      return
    fi
    step_done
  fi
  rm -rf "${D:?}/$name" && ln -s "$cache" "$D/$name"
}

# --- schemathesis (PyPI) in its own virtual environment: test/admin/fuzz.sh fuzzes the admin API with it.
# It prefers Python 3.12 or newer where the machine has one: under CPython 3.11.7, hypothesis's description of
# its own filters can die in ast.parse ("AST constructor recursion depth mismatch"), a CPython bug, which ends the
# fuzz run with an internal error instead of a verdict.
fuzz_python() {
  local c
  for c in python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[3-9]*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3 python3; do
    if "$c" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then echo "$c"; return; fi
  done
  echo python3
}
python_venv schemathesis "$(fuzz_python)" schemathesis 'the admin fuzz test' schemathesis

# --- Python packages a user's agent would use, in their own virtual environment: the official openai package
# (test/serve/python-agent.test.ts drives `rlstream serve` with it) and confluent-kafka with Avro support
# (test/serve/python-producer.test.ts publishes trajectories with it, from docs/events.md).
python_venv python python3 'openai, confluent_kafka.schema_registry.avro' 'the Python agent and producer tests' \
  openai 'confluent-kafka[avro,schemaregistry]'

# --- Agent frameworks a user would point at `rlstream serve`, pinned (test/serve/frameworks.test.ts drives each:
# the openai client, LangGraph's ReAct agent on langchain-openai, the OpenAI Agents SDK).
python_venv pyagents python3 'openai, langgraph.prebuilt, langchain_openai, agents' 'the agent framework test (test/serve/frameworks.test.ts)' \
  openai==3.57.0 langgraph==1.2.24 langchain-openai==1.7.4 langchain-core==1.8.3 openai-agents==0.24.0

# --- llama.cpp's server and SmolLM2-135M-Instruct, for the tests against a real inference server (built once,
# about 12 minutes on 2 cores; cached under .infra/llama.cpp/).
bash infra/llama-server.sh || say "WARNING: llama.cpp's server could not be installed (see above): the tests against it will be skipped"

elapsed=$(($(date +%s) - started))
if [ "$elapsed" -gt 5 ]; then say "done in ${elapsed}s"; fi
