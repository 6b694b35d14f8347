# The PyTorch baseline of the data-parallel benchmark (issue #53 item 3): the same model (bench/gpu_model.py's Llama at
# Qwen2.5's 1.5B / 3B / 7B shapes, as test/gpu/driver.cpp's lora_bench_models), the same per-rank batch (rank R's
# tokens g = R*T + t) and the same policy loss, AdamW and clipping as `driver dp`, trained with FSDP2: every layer
# and the root wrapped by fully_shard, parameters gathered in bf16 and gradients reduce-scattered in fp32
# (MixedPrecisionPolicy, as verl's FSDP workers configure it). Started by torchrun, one process per GPU:
#   torchrun --standalone --nproc_per_node=N test/gpu/fsdp_ref.py --model 1.5B [--iters 10] [--recompute]
# Prints one BENCH line per rank: the step time, tokens/s of all ranks together and the rank's peak memory.
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from gpu_model import Llama, policy_loss, step_flops  # noqa: E402

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab, tied (driver.cpp lora_bench_models)
    "1.5B": (1536, 28, 12, 2, 8960, 151936, True),
    "3B": (2048, 36, 16, 2, 11008, 151936, True),
    "7B": (3584, 28, 28, 4, 18944, 152064, False),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="1.5B")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--recompute", action="store_true", help="activation checkpointing per layer (as the driver's --recompute)")
    a = ap.parse_args()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dev = torch.device("cuda")
    torch.empty(1, device=dev)
    free0, _ = torch.cuda.mem_get_info()
    H, L, NH, NKV, I, V, tied = SHAPES[a.model]
    cfg = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV, intermediate_size=I,
               vocab_size=V, tie_word_embeddings=tied, attention_bias=True, rope_theta=1e6, rms_norm_eps=1e-6,
               max_position_embeddings=32768)
    torch.manual_seed(1)
    with torch.device(dev):
        model = Llama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.uniform_(-0.02, 0.02)
    if a.recompute:
        from torch.utils.checkpoint import checkpoint

        for layer in model.model.layers:
            inner = layer.forward
            layer.forward = lambda *x, f=inner: checkpoint(f, *x, use_reentrant=False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    seqs, length = a.seqs, a.len
    T = seqs * length
    g = torch.arange(T, device=dev, dtype=torch.int64) + rank * T
    tokens = ((g * 7919) % V).view(seqs, length)
    targets = ((g * 104729 + 3) % V).view(seqs, length)
    adv = (((g % 13) - 6).float() / 6).view(seqs, length)
    behav = (-torch.log(torch.tensor(float(V))) + ((g % 5) - 2).float() * 0.05).to(dev).view(seqs, length)
    mask = torch.ones(seqs, length, device=dev)
    pos = torch.arange(length, device=dev)[None].expand(seqs, length)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    last = [0.0]

    def step():
        logits = model(tokens, pos)
        loss = policy_loss(logits, targets, mask, adv, behav, clip_low=0.2, clip_high=0.28, entropy_coef=1e-3)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last[0] = loss

    step()
    step()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(a.iters):
        step()
    torch.cuda.synchronize()
    s = (time.time() - t0) / a.iters
    free1, _ = torch.cuda.mem_get_info()
    nparams = sum(p.numel() for p in model.parameters())  # DTensor shards report the whole tensor's numel
    row = dict(impl="pytorch-fsdp2" + ("-recompute" if a.recompute else ""), model=a.model, ranks=n, rank=rank, params=nparams, tokens_per_rank=T,
               step_ms=round(s * 1e3, 2), tokens_per_s=round(n * T / s),
               mfu_per_gpu=round(step_flops(cfg, seqs, length) / s / 989e12 * 100, 2),
               peak_mib=round((free0 - free1) / 2**20), torch_max_allocated_mib=round(torch.cuda.max_memory_allocated() / 2**20),
               loss=round(float(last[0].detach()), 4))
    print("BENCH " + json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
