"""GPU busy share of a command, by NVML: samples the card's utilization.gpu (NVML: the share of the last sample
period in which one or more kernels ran) of every GPU every --every-ms beside the command (GPU 0's in the main
figures, each GPU's over the RL phase too where there are several), stamps each of the command's stderr
lines with the time it arrived, and prints one JSON line: the mean over the command's wall and over its RL phase
(from the first line after the initial evaluation's last to the "train" line that reached trainer.max_steps, as
`rlstream run`'s progress lines on a non-TTY stderr show them; absent when the lines do not show it). The command's
stdout goes to --out/stdout, its stamped stderr to --out/stderr, the samples to --out/samples.csv.
  python3 test/gpu/gpu_busy.py --out DIR [--every-ms 100] -- COMMAND ARGS...
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

import pynvml


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--every-ms", type=float, default=100)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    os.makedirs(a.out, exist_ok=True)
    pynvml.nvmlInit()
    # every GPU of the machine: the first is the trainer's (and the one-GPU run's); others hold rollout engines
    devs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    samples = []  # (time, GPU 0's utilization, GPU 0's memory MiB, [every GPU's utilization])
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            us = [pynvml.nvmlDeviceGetUtilizationRates(d).gpu for d in devs]
            m = pynvml.nvmlDeviceGetMemoryInfo(devs[0])
            samples.append((time.time(), us[0], m.used / 2**20, us))
            time.sleep(a.every_ms / 1000)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.time()
    lines = []
    with open(os.path.join(a.out, "stdout"), "wb") as so:
        p = subprocess.Popen(cmd, stdout=so, stderr=subprocess.PIPE)
        for raw in p.stderr:
            lines.append((time.time(), raw.decode("utf-8", "replace").rstrip("\n")))
        rc = p.wait()
    t1 = time.time()
    stop.set()
    th.join()
    with open(os.path.join(a.out, "stderr"), "w") as f:
        for t, l in lines:
            f.write(f"{t:.3f} {l}\n")
    with open(os.path.join(a.out, "samples.csv"), "w") as f:
        f.write("epoch_s,utilization_gpu_pct,memory_used_mib," + ",".join(f"gpu{i}_pct" for i in range(len(devs))) + "\n")
        for t, u, m, us in samples:
            f.write(f"{t:.3f},{u},{m:.0f}," + ",".join(str(x) for x in us) + "\n")

    def mean(lo, hi, gpu=0):
        xs = [us[gpu] for t, _, _, us in samples if lo <= t <= hi]
        return (round(sum(xs) / len(xs), 1), len(xs)) if xs else (None, 0)

    # the RL phase: after the initial evaluation's last progress line, until the last train line
    initial = [t for t, l in lines if re.search(r"\beval\b.*\binitial\b", l)]
    train = [t for t, l in lines if re.search(r"\btrain\b", l)]
    rl = (initial[-1] if initial else (train[0] if train else None), train[-1] if train else None)
    whole, n = mean(t0, t1)
    summary = {"command": " ".join(cmd), "rc": rc, "wall_s": round(t1 - t0, 2), "samples": n, "every_ms": a.every_ms,
               "busy_pct_wall": whole, "max_memory_mib": round(max((m for _, _, m, _ in samples), default=0))}
    if rl[0] is not None and rl[1] is not None and rl[1] > rl[0]:
        summary["rl_window_s"] = round(rl[1] - rl[0], 2)
        summary["busy_pct_rl"], summary["samples_rl"] = mean(*rl)
        if len(devs) > 1:
            summary["busy_pct_rl_per_gpu"] = [mean(*rl, gpu=i)[0] for i in range(len(devs))]
    try:
        with open(os.path.join(a.out, "stdout")) as f:
            out = [json.loads(l) for l in f if l.startswith("{")]
        if out:
            r = out[-1].get("rl", {})
            summary["run"] = {"wall_seconds": out[-1].get("wall_seconds"), "rl_seconds": r.get("seconds"),
                              "generated_tokens": r.get("generated_tokens"), "trained_tokens": r.get("trained_tokens"),
                              "trainer_compute_seconds": r.get("trainer_compute_seconds"),
                              "trainer_wait_seconds": r.get("trainer_wait_seconds"), "backend_seconds": r.get("backend_seconds"),
                              "heldout_before": out[-1].get("heldout_accuracy_before"), "heldout_after": out[-1].get("heldout_accuracy_after")}
    except (OSError, ValueError):
        pass
    print(json.dumps(summary), flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
