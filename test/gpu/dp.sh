#!/usr/bin/env bash
# Data-parallel training on the GPUs of one host (issue #53 item 3), rlstream against PyTorch FSDP2 in one call:
#   bash test/gpu/dp.sh [SHAPES]        (default "1.5B 3B"; needs test/gpu/run.sh build first, which builds the driver)
# 1. check: two steps at N=2 (DDP and ZeRO-1) against one GPU training both ranks' tokens: every rank of both modes
#    must end with the same parameter hash (the script fails otherwise), and the sampled parameters' distance to the
#    one-GPU run is printed (DPDIFF lines).
# 2. bench, per shape: the driver's `dp` at 1 GPU and at every N up to the GPUs present (DDP and ZeRO-1), then
#    test/gpu/fsdp_ref.py under torchrun at the same N; one process per GPU, each measured on its own. The N=2 DDP
#    run also times a version's weights from rank 0 to rank 1 by NCCL broadcast against a file (BCAST line).
# Env: DP_CHECK (1; 0 skips step 1), DP_ITERS (10), DP_RANKS (the GPUs present, counted by nvidia-smi), FSDP_TIMEOUT (300 s each).
set -uo pipefail
cd "$(dirname "$0")/../.."
gpu_script=test/gpu/dp.sh gpu_build=/tmp/rlstream-gpu-build
source test/gpu/env.sh
[ -x "$B/driver" ] || { echo "dp.sh: no driver in $B: run bash test/gpu/run.sh build first"; exit 1; }
export RLSTREAM_NCCL_LIBRARY
RLSTREAM_NCCL_LIBRARY=$(find_nccl)
gpus=$(nvidia-smi -L | wc -l)
max=${DP_RANKS:-$gpus}
iters=${DP_ITERS:-10}
log="$OUT/dp.log"
status=0

# ranks N, then the driver's dp arguments: one process per GPU, each seeing its GPU alone
ours() {
  local n=$1 shape=$2 id r pids=()
  shift 2
  id=$(mktemp -u /tmp/rlstream-dp-id.XXXXXX)
  for ((r = 0; r < n; r++)); do
    CUDA_VISIBLE_DEVICES=$r "$B/driver" dp "$shape" --rank=$r --ranks="$n" --id="$id" "$@" & pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || { echo "dp: a rank of ours (n=$n $shape $*) exited with $?"; status=1; }; done
  rm -f "$id"
}
# the sampled parameters (every 1009th) of a two-step run against the one-GPU run's
dpdiff() {
  python3 - "$1" "$OUT/dp-1.bin" "$2" <<'PY'
import json, sys
import numpy as np
a, b = np.fromfile(sys.argv[2], np.float32), np.fromfile(sys.argv[3], np.float32)
d = np.abs(a - b)
print("DPDIFF " + json.dumps(dict(what=sys.argv[1] + ", parameters after 2 steps, every 1009th", count=int(len(a)),
      max_abs=float(d.max()), mean_abs=float(d.mean()), over_1e_6=int((d > 1e-6).sum()))))
PY
}
theirs() {
  local n=$1 shape=$2
  timeout "${FSDP_TIMEOUT:-300}" torchrun --standalone --nproc_per_node="$n" test/gpu/fsdp_ref.py --model "$shape" --iters "$iters" ||
    echo "BENCH {\"impl\":\"pytorch-fsdp2\",\"model\":\"$shape\",\"ranks\":$n,\"error\":\"exit $? (timeout is 124)\"}"
}

# everything below to the log as well; the status of each rank stays in this shell
exec > >(tee "$log") 2>&1
{
  echo "== dp: $gpus GPU(s), libnccl.so.2: ${RLSTREAM_NCCL_LIBRARY:-found by the dynamic loader}, $(date -u +%FT%TZ)"
  nvidia-smi topo -m 2>/dev/null | head -5
  if [ "$max" -ge 2 ] && [ "${DP_CHECK:-1}" = 1 ]; then
    ours 1 1.5B --check=2 --seqs=16 --dump="$OUT/dp-1.bin"
    ours 2 1.5B --check=2 --dump="$OUT/dp-2.bin" >"$OUT/dpcheck.txt"
    ours 2 1.5B --check=2 --zero1 --dump="$OUT/dp-2z.bin" >>"$OUT/dpcheck.txt"
    cat "$OUT/dpcheck.txt"
    dpdiff "ddp n=2 vs n=1" "$OUT/dp-2.bin"
    dpdiff "zero1 n=2 vs n=1" "$OUT/dp-2z.bin"
    # the check itself: every rank of both modes ends with the same parameters, bit for bit (FNV-1a of the block)
    hashes=$(grep '^DPCHECK ' "$OUT/dpcheck.txt" | grep -o '"params_fnv":"[0-9a-f]*"' | sort -u)
    lines=$(grep -c '^DPCHECK ' "$OUT/dpcheck.txt")
    if [ "$lines" != 4 ] || [ "$(echo "$hashes" | wc -l)" != 1 ]; then
      echo "dp: FAILED: expected 4 ranks' parameters with one hash, got $lines line(s) and hashes: $hashes"
      status=1
    else
      echo "dp: check ok: DDP and ZeRO-1, both ranks, one parameter hash ($hashes)"
    fi
  fi
  for shape in ${1:-1.5B 3B}; do
    ours 1 "$shape" --iters="$iters"
    theirs 1 "$shape"
    for ((n = 2; n <= max; n *= 2)); do
      if [ "$n" = 2 ]; then ours "$n" "$shape" --iters="$iters" --broadcast; else ours "$n" "$shape" --iters="$iters"; fi
      ours "$n" "$shape" --iters="$iters" --zero1
      theirs "$n" "$shape"
    done
  done
}
python3 - "$log" <<'PY'
import json, sys
rows = [json.loads(l.split(" ", 1)[1]) for l in open(sys.argv[1]) if l.startswith("BENCH ")]
rows = [r for r in rows if r.get("rank", 0) == 0]
print("\nmodel impl            GPUs tokens/s  step ms comm ms peak MiB (rank 0)  scaling vs its 1 GPU")
for r in rows:
    if "error" in r:
        print(f"{r['model']:<5} {r['impl']:<15} {r['ranks']:<4} {r['error']}")
        continue
    one = next((o for o in rows if o["model"] == r["model"] and o["ranks"] == 1 and "error" not in o
                and o["impl"].split("-")[0] == r["impl"].split("-")[0]), None)
    eff = f"{r['tokens_per_s'] / (r['ranks'] * one['tokens_per_s']) * 100:.1f}%" if one else "-"
    print(f"{r['model']:<5} {r['impl']:<15} {r['ranks']:<4} {r['tokens_per_s']:<9} {r['step_ms']:<7} {r.get('comm_ms', '-')!s:<7} {r['peak_mib']:<18} {eff}")
PY
exit $status
