# LoRA against PEFT on the GPU machine (transformers' Qwen2ForCausalLM with PEFT's LoraConfig):
#   peft_ref.py parity <file>     the adapters' gradients and the loss of one cross-entropy step dumped by
#                                 `driver lora-dump` (ours on CUDA and on the CPU) against PEFT in float64 on the same
#                                 weights, adapters and batch; PEFT under bf16 autocast against the same reference is
#                                 printed as the yardstick of bf16 error. Exit 1 when a check fails.
#   peft_ref.py bench --model 7B [--compile [layers|model]] [--seqs N --len N --rank R --iters N]
#                                 PyTorch + PEFT LoRA step (bf16 weights, adapters fp32, gradient checkpointing,
#                                 cross-entropy through the model's own loss, clip, AdamW) at driver.cpp's
#                                 lora_bench_models() shapes, random init; prints a BENCH line. --compile: each
#                                 decoder layer under torch.compile (regional); --compile model: the whole model.
# Memory: device memory in use (total - free, as the driver measures it) after the timed steps minus before the
# model; torch's allocator peaks (max allocated, max reserved) beside it.
import json
import sys
import time

import torch

SHAPES = {  # the shapes of driver.cpp lora_bench_models(): Qwen2.5-1.5B, 3B, 7B
    "1.5B": (dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True), 8, 1024),
    "3B": (dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2, intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True), 8, 1024),
    "7B": (dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False), 1, 32768),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def qwen2(cfg, dtype, attn):
    """Qwen2ForCausalLM (q/k/v biases, as the dumps' attention_bias) of this shape, built directly in `dtype`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    keep = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")
    theta = cfg.get("rope_theta", 10000.0)
    c = Qwen2Config(rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), max_position_embeddings=32768, use_sliding_window=False, rope_theta=theta, **{k: cfg[k] for k in keep})
    if getattr(c, "rope_parameters", None) is not None:  # transformers 5 keeps rope_theta there
        c.rope_parameters = {**c.rope_parameters, "rope_type": "default", "rope_theta": theta}
    c._attn_implementation = attn
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        m = Qwen2ForCausalLM(c)
    finally:
        torch.set_default_dtype(old)
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = m.model.rotary_emb.inv_freq
    want = theta ** (-2.0 / hd)
    assert abs(inv[1].item() - want) < 1e-6 * max(1.0, want) + 1e-9, f"rotary theta: inv_freq[1] {inv[1].item()} != {want}"
    return m


def peft_wrap(model, r, alpha):
    import peft
    from peft import LoraConfig, get_peft_model

    print(f"peft {peft.__version__} from {peft.__file__}")
    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGETS, bias="none"))


def parity(path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, "pt") as f:
        meta = f.metadata()
    t = load_file(path, device="cuda")
    cfg = json.loads(meta["config"])
    lc = json.loads(meta["lora"])
    tokens, targets, mask = t["tokens"].long(), t["targets"].long(), t["mask"].double()
    S = 4
    L = tokens.numel() // S
    params = {k[len("param."):]: v for k, v in t.items() if k.startswith("param.")}
    base = {k: v for k, v in params.items() if ".lora_" not in k}
    adapters = {k: v for k, v in params.items() if ".lora_" in k}
    failures = 0

    def run(dtype, autocast):
        torch.manual_seed(0)
        m = qwen2(cfg, torch.float32, "eager").cuda()  # (float64 below, after the weights are in)
        missing, unexpected = m.load_state_dict(base, strict=False)
        assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
        m = peft_wrap(m, lc["r"], lc["lora_alpha"]).to(dtype)
        mods = dict(m.named_modules())
        for name, a in adapters.items():  # model.layers.N.self_attn.q_proj.lora_A.weight
            mod, which = name.rsplit(".lora_", 1)
            lin = mods["base_model.model." + mod]
            (lin.lora_A if which.startswith("A") else lin.lora_B)["default"].weight.data.copy_(a.to(dtype))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = m(input_ids=tokens.view(S, L)).logits.reshape(S * L, -1)
        logp = torch.log_softmax(logits.double() if dtype == torch.float64 else logits.float(), -1)
        tl = logp.gather(1, targets.clamp_min(0).view(-1, 1)).view(-1)
        loss = -(tl * mask.to(tl.dtype)).sum() / mask.sum()
        loss.backward()
        grads = {}
        for name in adapters:
            mod, which = name.rsplit(".lora_", 1)
            lin = mods["base_model.model." + mod]
            grads[name] = (lin.lora_A if which.startswith("A") else lin.lora_B)["default"].weight.grad.double()
        frozen = [n for n, p in m.named_parameters() if p.requires_grad and ".lora_" not in n]
        assert not frozen, f"PEFT trains more than the adapters: {frozen[:3]}"
        return loss.item(), grads

    ref_loss, ref = run(torch.float64, False)
    bf_loss, bf = run(torch.float32, True)

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()

    def worst(grads):
        return max((rel(grads[n], ref[n]), n) for n in ref)

    print(f"loss: PEFT float64 {ref_loss:.8f}, PEFT bf16 autocast {bf_loss:.8f}, ours cuda {float(meta['cuda.loss']):.8f}, ours cpu {float(meta['cpu.loss']):.8f}")
    yard = worst(bf)
    print(f"PEFT bf16 autocast vs PEFT float64: worst adapter gradient rel {yard[0]:.2e} ({yard[1]})")
    for dev, tol, ltol in (("cpu", 1e-4, 1e-6), ("cuda", max(2e-2, 3 * yard[0]), 2e-3)):
        g = {n: t[f"{dev}.grad.{n}"] for n in ref}
        w = worst(g)
        lrel = abs(float(meta[f"{dev}.loss"]) - ref_loss) / abs(ref_loss)
        ok = w[0] <= tol and lrel <= ltol
        failures += not ok
        print(f"ours {dev} vs PEFT float64: loss rel {lrel:.2e} (tol {ltol:.0e}); {len(g)} adapter gradients, worst rel {w[0]:.2e} ({w[1]}), tol {tol:.1e}: {'ok' if ok else 'FAIL'}")
        for kind in ("lora_A", "lora_B"):
            rs = [rel(g[n], ref[n]) for n in ref if kind in n]
            print(f"  {kind}: mean rel {sum(rs) / len(rs):.2e}, max {max(rs):.2e}")
    return failures


def base_layers(m):
    """The decoder layers under PEFT's wrappers (PeftModel -> LoraModel -> Qwen2ForCausalLM -> Qwen2Model)."""
    return m.get_base_model().model.layers


def used():
    f, t = torch.cuda.mem_get_info()
    return t - f


def bench(argv):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--compile", nargs="?", const="layers", choices=["layers", "model"], default=None)
    ap.add_argument("--seqs", type=int, default=0)
    ap.add_argument("--len", type=int, default=0)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args(argv)
    cfg, seqs, length = SHAPES[a.model]
    seqs, length = a.seqs or seqs, a.len or length
    impl = f"peft-compile-{a.compile}" if a.compile else "peft-eager"
    torch.cuda.init()
    torch.empty(1, device="cuda")
    base = used()
    try:
        t0 = time.time()
        with torch.device("cuda"):
            m = qwen2({**cfg, "rope_theta": 1e6}, torch.bfloat16, "sdpa")
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.config.use_cache = False
        m = peft_wrap(m, a.rank, 2 * a.rank)
        for n, p in m.named_parameters():
            if p.requires_grad:
                p.data = p.data.float()  # adapters and their AdamW state in fp32, as ours; the base stays bf16
        trainable = [p for p in m.parameters() if p.requires_grad]
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        opt = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
        fwd = m
        if a.compile == "model":
            fwd = torch.compile(m)
        elif a.compile == "layers":
            # Regional compilation (PyTorch's recipe for repeated blocks): each decoder layer compiled, the 28 alike
            # layers sharing one compiled graph, so compiling takes one layer's time; the whole model under
            # torch.compile with checkpointing did not finish its first step within 110 s at any shape (RESULTS.md).
            for layer in base_layers(m):
                layer.compile()
        T = seqs * length
        V = cfg["vocab_size"]
        ids = (torch.arange(T, device="cuda") * 7919 % V).view(seqs, length)
        labels = ((torch.arange(T, device="cuda") * 104729 + 3) % V).view(seqs, length)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                # the model's own shifted cross-entropy: labels given unshifted, as a user passes them
                loss = fwd(input_ids=ids, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            return loss

        w0 = time.time()
        step()
        torch.cuda.synchronize()
        warm = time.time() - w0
        t1 = time.time()
        for _ in range(a.iters):
            loss = step()
        torch.cuda.synchronize()
        sec = (time.time() - t1) / a.iters
        peak = used() - base
        r = dict(impl=impl, model=a.model, rank=a.rank, seqs=seqs, len=length, tokens=T, step_ms=round(sec * 1e3, 1), tokens_per_s=round(T / sec), device_used_mib=round(peak / 2**20), max_allocated_mib=round(torch.cuda.max_memory_allocated() / 2**20), max_reserved_mib=round(torch.cuda.max_memory_reserved() / 2**20), first_step_s=round(warm, 1), build_s=round(w0 - t0, 1), loss=round(loss.item(), 4), adapter_params=sum(p.numel() for p in trainable))
    except torch.OutOfMemoryError as e:
        r = dict(impl=impl, model=a.model, seqs=seqs, len=length, error="out of memory: " + str(e).split("\n")[0][:200])
    print("BENCH " + json.dumps(r), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "parity":
        sys.exit(1 if parity(sys.argv[2]) else 0)
    bench(sys.argv[2:])
