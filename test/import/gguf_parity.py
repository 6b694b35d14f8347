"""Checks `rlstream import gguf` against independent readers: the `gguf` package (llama.cpp's own Python reader)
and Hugging Face transformers loading the same GGUF file.

  python test/import/gguf_parity.py <model.gguf> <imported dir> [--dump out.json]

Prints one JSON line: the max abs difference per tensor kind between the imported safetensors and gguf's
dequantization (q/k rows put back by transformers' own reverse permutation), between the imported weights and
the state dict transformers builds from the GGUF, the max abs logit difference of the two models on a few
prompts, and whether the two tokenizers encode the prompts alike. --dump writes the prompts' token ids and
transformers' log-probs of each next token, for test/import/native_parity.ts.
Needs: pip install torch transformers gguf safetensors (CPU is enough).
"""
import argparse
import json
import sys

import numpy as np
import torch
from gguf import GGUFReader, dequantize
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "In 1969, 3 astronauts flew 384,400 km to the Moon.",
]


def hf_name(name):
    glob = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    if name in glob:
        return glob[name]
    local = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    _, layer, kind, _ = name.split(".")
    return f"model.layers.{layer}.{local[kind]}.weight"


def reverse_permute(w, n_head):
    # transformers' LlamaTensorProcessor._reverse_permute_weights
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("imported")
    ap.add_argument("--dump")
    args = ap.parse_args()
    torch.set_num_threads(2)

    imported = load_file(f"{args.imported}/model.safetensors")
    cfg = json.load(open(f"{args.imported}/config.json"))
    reader = GGUFReader(args.gguf)
    per_type = {}
    for t in reader.tensors:
        ref = dequantize(t.data, t.tensor_type).astype(np.float32)
        if ".attn_q." in t.name:
            ref = reverse_permute(ref, cfg["num_attention_heads"])
        elif ".attn_k." in t.name:
            ref = reverse_permute(ref, cfg["num_key_value_heads"])
        mine = imported[hf_name(t.name)]
        assert mine.shape == ref.shape, (t.name, mine.shape, ref.shape)
        key = t.tensor_type.name
        per_type[key] = max(per_type.get(key, 0.0), float(np.abs(mine - ref).max()))

    ours = LlamaForCausalLM.from_pretrained(args.imported, dtype=torch.float32).eval()
    theirs = AutoModelForCausalLM.from_pretrained(
        args.gguf.rsplit("/", 1)[0], gguf_file=args.gguf.rsplit("/", 1)[1], dtype=torch.float32
    ).eval()
    sd_theirs = theirs.state_dict()
    state_diff = 0.0
    for k, v in ours.state_dict().items():
        state_diff = max(state_diff, float((v - sd_theirs[k]).abs().max()))

    tok_ours = PreTrainedTokenizerFast.from_pretrained(args.imported)
    tok_theirs = AutoTokenizer.from_pretrained(args.gguf.rsplit("/", 1)[0], gguf_file=args.gguf.rsplit("/", 1)[1])
    chat = tok_ours.apply_chat_template([{"role": "user", "content": "What is 12 * 7?"}], tokenize=False, add_generation_prompt=True)
    prompts = PROMPTS + [chat]
    logit_diff, same_tokens, dump = [], True, []
    with torch.no_grad():
        for p in prompts:
            ids = tok_ours(p, add_special_tokens=False)["input_ids"]
            same_tokens &= ids == tok_theirs(p, add_special_tokens=False)["input_ids"]
            x = torch.tensor([ids])
            a = ours(x).logits[0]
            b = theirs(x).logits[0]
            logit_diff.append(float((a - b).abs().max()))
            lp = torch.log_softmax(a.double(), -1)
            dump.append({"ids": ids, "logprobs": [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]})
    if args.dump:
        json.dump({"prompts": prompts, "sequences": dump}, open(args.dump, "w"))
    print(json.dumps({
        "dequant_max_abs_diff_by_type": per_type,
        "state_dict_max_abs_diff_vs_transformers_gguf": state_diff,
        "logits_max_abs_diff_per_prompt": logit_diff,
        "tokens_per_prompt": [len(d["ids"]) for d in dump],
        "tokenizers_agree": same_tokens,
        "chat_template_render": chat,
    }))


if __name__ == "__main__":
    sys.exit(main())
