# Sourced by the GPU scripts that build with the CUDA toolkit (run.sh, nccl.sh): where their outputs and builds go,
# the skip on a machine without nvcc or a GPU (the script exits 0, saying so), the toolkit's root, and the linker
# flags for its runtime libraries. The script sets gpu_script (its name) and gpu_build (its default build directory)
# first.
OUT=${OUT:-/tmp/rlstream-gpu}
B=${RLSTREAM_GPU_BUILD:-$gpu_build}
mkdir -p "$OUT" "$B"
if ! command -v nvcc >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "$gpu_script: skipped (needs the CUDA toolkit and an NVIDIA GPU)"
  exit 0
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
# The runtime libraries sit in lib64 (Debian, NVIDIA's installers), lib, or targets/x86_64-linux/lib (conda, pip).
cuda_link=(-L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -L"$CUDA_HOME/targets/x86_64-linux/lib" -Wl,-rpath,"$CUDA_HOME/lib64")
# NVLink multicast off in every process these scripts start: on the shared multi-GPU machines it can put GPUs that
# others use out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# libnccl.so.2 for the native core's dlopen: RLSTREAM_NCCL_LIBRARY, else the loader's path, else pip's
# nvidia-nccl-cu12/-cu13 (PyTorch's NCCL) under python3's site-packages. Prints the path, or nothing for the loader's.
find_nccl() {
  local lib=${RLSTREAM_NCCL_LIBRARY:-} sp
  if [ -z "$lib" ] && ! ldconfig -p | grep -q 'libnccl.so.2 '; then
    sp=$(python3 -c 'import site; print(chr(10).join(site.getsitepackages()))' 2>/dev/null || true)
    lib=$(echo "$sp" | while read -r d; do [ -d "$d" ] && find "$d" -name libnccl.so.2 2>/dev/null; done | head -1)
  fi
  echo "$lib"
}
