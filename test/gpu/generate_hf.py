"""Decode throughput of Hugging Face transformers' generate with a static KV cache, the baseline of
test/gpu/generate-bench.ts: the SmolLM2-135M shape (or --shape 500m) with random weights in bf16, B prompts of `--context` random
tokens, `--steps` + 1 new tokens sampled at temperature 1 (top-k and top-p off). A streamer timestamps every step,
so decode time is the time from the first new token to the last (prefill excluded), as the Node bench counts it.
Modes: `eager` (generation_config.disable_compile) and `auto` (generate's own torch.compile of the forward, which
a static cache enables); each runs once to warm up (and compile) and once timed. One JSON line per run.
  python3 test/gpu/generate_hf.py [--shape 135m|500m] [--batches 1,64,256] [--context 512] [--steps 64] [--modes eager,auto]
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
    ap.add_argument("--shape", default="135m", choices=["135m", "500m"])
    a = ap.parse_args()
    common = dict(tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    if a.shape == "135m":
        cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
                          max_position_embeddings=8192, **common)
    else:
        # The training benchmark's 500M shape (Qwen2.5-0.5B's sizes, q/k/v biases): test/gpu/driver.cpp.
        from transformers import Qwen2Config, Qwen2ForCausalLM
        cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
                          max_position_embeddings=32768, **common)
    torch.manual_seed(0)
    model = (LlamaForCausalLM(cfg) if a.shape == "135m" else Qwen2ForCausalLM(cfg)).to("cuda", torch.bfloat16).eval()
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
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    print(json.dumps({"shape": a.shape, "parameters": params, "hbmCopyGBs": round(hbm_gbs),
                      "gpu": torch.cuda.get_device_name(0)}), flush=True)
    for mode in a.modes.split(","):
        for B in [int(x) for x in a.batches.split(",")]:
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
            step_bytes = params * 2 + B * a.context * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2
            print(json.dumps({
                "impl": f"transformers {mode} (static cache, bf16)", "shape": a.shape, "stepBytes": step_bytes,
                "batch": B, "context": a.context, "steps": steps,
                "warmupS": round(warm, 2), "prefillS": round(times[1] - times[0], 4),
                "decodeStepMs": round(decode / steps * 1000, 3), "decodeTokensPerS": round(B * steps / decode),
                "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
            }), flush=True)


if __name__ == "__main__":
    main()
