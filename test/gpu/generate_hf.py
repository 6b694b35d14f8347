"""Decode throughput of Hugging Face transformers' generate with a static KV cache, the baseline of
test/gpu/generate-bench.ts: the SmolLM2-135M shape (or --shape 500m, or --shape 7b: Qwen2.5-7B's sizes) with random weights in bf16, B prompts of `--context` random
tokens, `--steps` + 1 new tokens sampled at temperature 1 (top-k and top-p off). A streamer timestamps every step,
so decode time is the time from the first new token to the last (prefill excluded), as the Node bench counts it.
Modes: `eager` (generation_config.disable_compile) and `auto` (generate's own torch.compile of the forward, which
a static cache enables); each runs once to warm up (and compile) and once timed. One JSON line per run.
  python3 test/gpu/generate_hf.py [--shape 135m|500m|7b] [--batches 1,64,256] [--context 512] [--steps 64] [--modes eager,auto]
      [--order auto:64,eager:64,...] [--deadline-s S]
`--order` runs the named (mode:batch) cases first; `--deadline-s` prints a case as skipped, unrun, once the script has
run that long (compiling a 7B forward takes a minute or more a batch size).
It first prints the GPU's HBM bandwidth as a 2 GiB device copy measures it; stepBytes / that is a step's bound.
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.streamers import BaseStreamer


class StepClock(BaseStreamer):
    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--modes", default="eager,auto")
    ap.add_argument("--shape", default="135m", choices=["135m", "500m", "7b"])
    ap.add_argument("--order", default="")
    ap.add_argument("--deadline-s", type=float, default=0)
    a = ap.parse_args()
    common = dict(tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    if a.shape == "135m":
        cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
                          max_position_embeddings=8192, **common)
    elif a.shape == "7b":
        # Qwen2.5-7B's config.json sizes (q/k/v biases, an untied head)
        from transformers import Qwen2Config, Qwen2ForCausalLM
        cfg = Qwen2Config(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                          intermediate_size=18944, vocab_size=152064, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=32768, **{**common, "tie_word_embeddings": False})
    else:
        # The training benchmark's 500M shape (Qwen2.5-0.5B's sizes, q/k/v biases): test/gpu/driver.cpp.
        from transformers import Qwen2Config, Qwen2ForCausalLM
        cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=32768, **common)
    torch.manual_seed(0)
    start = time.perf_counter()
    # built on the GPU in bf16 (a 7B model built in fp32 on the host first takes 30 GB and minutes)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = (LlamaForCausalLM(cfg) if a.shape == "135m" else Qwen2ForCausalLM(cfg)).eval()
    torch.set_default_dtype(torch.float32)
    # HBM bandwidth as a copy of 2 GiB measures it (bytes read + written), for the decode step's lower bound.
    x = torch.empty(2**30, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    hbm_gbs = 10 * 2 * x.numel() * 2 / (time.perf_counter() - t0) / 1e9
    del x, y
    params = sum(p.numel() for p in model.parameters())
    # the weights a decode step reads: an untied embedding table is not among them (B of its rows are)
    read_params = params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    print(json.dumps({"shape": a.shape, "parameters": params, "hbmCopyGBs": round(hbm_gbs),
                      "gpu": torch.cuda.get_device_name(0)}), flush=True)
    cases = [(m, int(b)) for m in a.modes.split(",") for b in a.batches.split(",")]
    first = [(c.split(":")[0], int(c.split(":")[1])) for c in a.order.split(",") if c]
    cases = [c for c in first if c in cases] + [c for c in cases if c not in first]
    for mode, B in cases:
        if a.deadline_s and time.perf_counter() - start > a.deadline_s:
            print(json.dumps({"impl": f"transformers {mode}", "batch": B, "skipped": f"deadline {a.deadline_s} s passed"}), flush=True)
            continue
        ids = torch.randint(0, cfg.vocab_size, (B, a.context), device="cuda")
        n = a.steps + 1

        def run():
            clock = StepClock()
            t0 = time.perf_counter()
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                               do_sample=True, temperature=1.0, top_k=0, top_p=1.0, cache_implementation="static",
                               disable_compile=(mode == "eager"), streamer=clock, pad_token_id=0)
            torch.cuda.synchronize()
            return time.perf_counter() - t0, clock.times

        try:
            warm, _ = run()
            total, times = run()
        except Exception as e:  # report and go on to the next case
            print(json.dumps({"impl": f"transformers {mode}", "batch": B, "error": repr(e)[:300]}), flush=True)
            continue
        # times[0]: the prompt; times[1]: first new token (after prefill); times[-1]: the last
        decode = times[-1] - times[1]
        steps = len(times) - 2
        # bf16 weights and a bf16 static cache of context + steps per row: what a step reads at least
        step_bytes = read_params * 2 + B * a.context * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2
        print(json.dumps({
            "impl": f"transformers {mode} (static cache, bf16)", "shape": a.shape, "stepBytes": step_bytes,
            "batch": B, "context": a.context, "steps": steps,
            "warmupS": round(warm, 2), "prefillS": round(times[1] - times[0], 4),
            "decodeStepMs": round(decode / steps * 1000, 3), "decodeTokensPerS": round(B * steps / decode),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        }), flush=True)


if __name__ == "__main__":
    main()
