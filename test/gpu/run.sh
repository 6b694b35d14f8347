#!/usr/bin/env bash
# GPU checks and benchmark on a machine with nvcc, a GPU and PyTorch (no Node needed): builds the CUDA layer and
# the standalone driver (test/gpu/driver.cpp) with nvcc, then runs the steps named on the command line:
#   build | kernels | model | torch (step + training curve vs PyTorch) | bench (ours vs PyTorch eager / compile) | all
#   lora (adapter gradients vs PEFT, test/gpu/peft_ref.py) | lora-bench (LoRA step vs PyTorch + PEFT at 1.5B/3B/7B)
# Outputs (logs, dumps, JSON) go to $OUT (default /tmp/rlstream-gpu). Without nvcc or a GPU it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
gpu_script=test/gpu/run.sh gpu_build=/tmp/rlstream-gpu-build
source test/gpu/env.sh
ARCH=${RLSTREAM_CUDA_ARCH:--gencode=arch=compute_90,code=sm_90}
status=0

build() {
  local blas_inc="" blas_lib="-lopenblas"
  local hdr
  hdr=$(ls /usr/include/x86_64-linux-gnu/cblas.h /usr/include/x86_64-linux-gnu/openblas*/cblas.h /usr/include/cblas.h 2>/dev/null | head -1)
  if [ -z "$hdr" ] || ! ldconfig -p | grep -q libopenblas; then
    # No OpenBLAS here: the CPU reference gets a plain sgemm (test/gpu/blas_shim).
    blas_inc="-Itest/gpu/blas_shim"
    blas_lib=""
    g++ -O3 -std=c++17 -c test/gpu/blas_shim/blas_shim.cpp -o "$B/blas_shim.o" || return 1
    echo "build: no OpenBLAS on this machine, CPU reference uses test/gpu/blas_shim"
  else
    blas_inc="-I$(dirname "$hdr")"
    rm -f "$B/blas_shim.o"
  fi
  # every file compiled at once (a GPU machine has the cores), then each compiler's status checked
  local pids=()
  for f in native/cuda/*.cu; do
    nvcc -O3 -std=c++17 $ARCH -Xcompiler -fPIC -Xptxas -warn-spills -c "$f" -o "$B/$(basename "$f" .cu).o" & pids+=($!)
  done
  for f in native/src/model.cpp native/src/losses.cpp native/src/config.cpp native/src/cpu_kernels.cpp native/src/nccl_core.cpp test/gpu/driver.cpp; do
    g++ -O3 -march=native -fopenmp -std=c++17 -fno-math-errno -DRLSTREAM_CUDA -I"$CUDA_HOME/include" $blas_inc \
      -c "$f" -o "$B/$(basename "$f" .cpp).o" & pids+=($!)
  done
  local p failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  [ "$failed" = 0 ] || return 1
  g++ -fopenmp "$B"/*.o "${cuda_link[@]}" -lcublas -lcudart $blas_lib -ldl -o "$B/driver" || return 1
  echo "build: $B/driver"
}

run_step() {
  case "$1" in
    build) build 2>&1 | tee "$OUT/build.log" || status=1 ;;
    kernels) "$B/driver" kernels 2>&1 | tee "$OUT/kernels.log" || status=1 ;;
    model) "$B/driver" model 2>&1 | tee "$OUT/model.log" || status=1 ;;
    torch)
      { "$B/driver" step "$B/step.safetensors" && "$B/driver" train "$B/train.safetensors" 300 &&
        python3 test/gpu/torch_ref.py step "$B/step.safetensors" &&
        python3 test/gpu/torch_ref.py train "$B/train.safetensors"; } 2>&1 | tee "$OUT/torch.log" || status=1 ;;
    bench) python3 bench/gpu_torch.py --driver "$B/driver" --out "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1 ;;
    lora) { "$B/driver" lora-dump "$B/lora.safetensors" && python3 test/gpu/peft_ref.py parity "$B/lora.safetensors"; } 2>&1 | tee "$OUT/lora.log" || status=1 ;;
    lora-bench)
      # ours (recomputation per layer) and PyTorch + PEFT (gradient checkpointing), eager then compiled (LORA_COMPILE:
      # layers, the regional compilation, and/or model, the whole model), per shape;
      # each in its own process, so that each peak is its own
      for m in ${LORA_SHAPES:-1.5B 3B 7B}; do
        "$B/driver" lora-bench "$m" --recompute ${LORA_ARGS:-}
        python3 test/gpu/peft_ref.py bench --model "$m" ${LORA_ARGS:-}
        for c in ${LORA_COMPILE:-layers}; do
          timeout "${COMPILE_TIMEOUT:-300}" python3 test/gpu/peft_ref.py bench --model "$m" --compile "$c" ${LORA_ARGS:-} || echo "BENCH {\"impl\":\"peft-compile-$c\",\"model\":\"$m\",\"error\":\"exit $? (timeout ${COMPILE_TIMEOUT:-300} s is 124)\"}"
        done
      done 2>&1 | tee "$OUT/lora-bench.log" || status=1 ;;
    all) for s in build kernels model torch bench; do run_step $s; done ;;
    *) echo "unknown step $1"; status=2 ;;
  esac
}

export PYTHONUNBUFFERED=1
for s in "${@:-all}"; do run_step "$s"; done
exit $status
