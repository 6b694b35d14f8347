# GPU benchmark: training throughput (tokens/s), model FLOPs utilisation and peak GPU memory of one policy-loss
# training step (forward, backward, gradient clipping, AdamW) for the ~20M / ~120M / ~500M models, rlstream's CUDA
# core (test/gpu/driver.cpp bench) against PyTorch eager and torch.compile on the same model, batch and sequences.
# Each measurement runs in its own process so peak memory is its own. Run on the GPU machine:
#   python3 bench/gpu_torch.py --driver <built driver> [--models 20M,120M,500M] [--impls ours,eager,compile]
#   python3 bench/gpu_torch.py --one eager --model 20M        (one PyTorch measurement, prints a BENCH line)
# Memory: device memory in use (total - free) after the timed steps minus before the model, for both sides (nothing is
# freed between steps, so it is the peak); PyTorch's allocator peak (max_memory_allocated) is printed beside.
import argparse
import json
import os
import subprocess
import sys
import time

PEAK_TFLOPS = 989.0  # H100 SXM dense bf16, datasheet

MODELS = {
    # name: (config, sequences, length) -- the same shapes as driver.cpp bench_models()
    "20M": (dict(hidden_size=384, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2, intermediate_size=1024,
                 vocab_size=16384, tie_word_embeddings=True, attention_bias=False), 16, 1024),
    "120M": (dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4, intermediate_size=2560,
                  vocab_size=32000, tie_word_embeddings=True, attention_bias=False), 16, 1024),
    "500M": (dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                  vocab_size=151936, tie_word_embeddings=True, attention_bias=True), 8, 1024),
}
for c, _, _ in MODELS.values():
    c.update(rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=4096)


def one(impl, name, iters):
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from gpu_model import Llama, policy_loss, step_flops

    cfg, seqs, length = MODELS[name]
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.empty(1, device=dev)
    free0, total = torch.cuda.mem_get_info()
    torch.manual_seed(1)
    model = Llama(cfg).to(dev)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.fill_(1.0)
            elif n.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0, 0.02)
    V, T = cfg["vocab_size"], seqs * length
    t = torch.arange(T, device=dev, dtype=torch.int64)
    tokens = ((t * 7919) % V).view(seqs, length)
    targets = ((t * 104729 + 3) % V).view(seqs, length)
    adv = (((t % 13) - 6).float() / 6).view(seqs, length)
    behav = (-torch.log(torch.tensor(float(V))) + ((t % 5) - 2).float() * 0.05).to(dev).view(seqs, length)
    mask = torch.ones(seqs, length, device=dev)
    pos = torch.arange(length, device=dev)[None].expand(seqs, length)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def loss_fn(tokens, pos, targets, mask, adv, behav):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens, pos)
        return policy_loss(logits, targets, mask, adv, behav, clip_low=0.2, clip_high=0.28, entropy_coef=1e-3)

    fn = torch.compile(loss_fn) if impl == "compile" else loss_fn
    last = [0.0]

    def step():
        loss = fn(tokens, pos, targets, mask, adv, behav)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last[0] = loss

    t0 = time.time()
    step()
    step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    s = (time.time() - t0) / iters
    free1, _ = torch.cuda.mem_get_info()
    flops = step_flops(cfg, seqs, length)
    nparams = sum(p.numel() for p in model.parameters())
    row = dict(impl="pytorch-" + impl, model=name, params=nparams, tokens=T, step_ms=round(s * 1e3, 2),
               tokens_per_s=round(T / s), mfu=round(flops / s / (PEAK_TFLOPS * 1e12) * 100, 2),
               peak_mib=round((free0 - free1) / 2**20), torch_max_allocated_mib=round(torch.cuda.max_memory_allocated() / 2**20),
               warmup_s=round(warm, 1), loss=round(float(last[0]), 4))
    print("BENCH " + json.dumps(row), flush=True)


def parse_bench(out):
    rows = []
    for line in out.splitlines():
        if line.startswith("BENCH "):
            rows.append(json.loads(line[6:]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver")
    ap.add_argument("--models", default="20M,120M,500M")
    ap.add_argument("--impls", default="ours,eager,compile")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--one")
    ap.add_argument("--model")
    ap.add_argument("--timeout", type=int, default=300)
    a = ap.parse_args()
    if a.one:
        one(a.one, a.model, a.iters)
        return
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("no CUDA GPU")
    except ImportError as e:
        print(f"bench/gpu_torch.py: skipped ({e})")
        return
    rows = []
    for name in a.models.split(","):
        for impl in a.impls.split(","):
            if impl == "ours":
                cmd = [a.driver, "bench", name, f"--iters={a.iters}"]
            else:
                cmd = [sys.executable, __file__, "--one", impl, "--model", name, "--iters", str(a.iters)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                got = parse_bench(p.stdout)
                if not got:
                    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
                    print(f"{impl} {name}: no result (exit {p.returncode}): {' | '.join(tail)}", flush=True)
                    rows.append(dict(impl=impl, model=name, error=" | ".join(tail)[-300:]))
                for r in got:
                    print("BENCH " + json.dumps(r), flush=True)
                rows += got
            except subprocess.TimeoutExpired:
                print(f"{impl} {name}: timed out after {a.timeout} s", flush=True)
                rows.append(dict(impl=impl, model=name, error="timeout"))
    print("\nmodel  impl              tokens/s    MFU %   step ms  peak MiB  ratio (ours / this)")
    for name in a.models.split(","):
        ours = next((r for r in rows if r["model"] == name and r["impl"] == "rlstream-cuda"), None)
        for r in rows:
            if r["model"] != name or "error" in r:
                continue
            ratio = f"{ours['tokens_per_s'] / r['tokens_per_s']:.2f}x" if ours else "-"
            print(f"{name:<6} {r['impl']:<17} {r['tokens_per_s']:<11} {r['mfu']:<7} {r['step_ms']:<8} {r['peak_mib']:<9} {ratio}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
