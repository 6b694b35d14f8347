"""rlstream against Hugging Face transformers on model directories of each family, with no download: transformers
builds a small random model of each family from its config, with a tied and an untied head, and
save_pretrained(max_shard_size=...) writes it as a sharded directory (fp32, and bf16 beside it); a real model
(SmolLM2-135M-Instruct) comes in as the directories `rlstream import gguf` wrote (DIR/smollm2 in f32,
DIR/smollm2-bf16 with --dtype bf16). This script computes transformers' side, test/gpu/hf-parity.ts rlstream's
(CPU fp32 and CUDA) on the same directories, and `compare` puts them side by side.
  python3 test/gpu/hf_parity.py make DIR [NAMES]  # directories + reference.json + grads-<name>.safetensors
  node --import tsx test/gpu/hf-parity.ts DIR     # rlstream.json (+ exported/<name>: a trained step, exported)
  python3 test/gpu/hf_parity.py compare DIR       # parity.json and the table of docs/models.md
NAMES (comma-separated; default every random variant): the variants below and `smollm2`; `make` adds them to an
existing reference.json, so the real model can be measured in a later call on the same machine.
The reference: per-token log-probs of 3 packed sequences (39, 64 and 300 tokens), the whole next-token distribution
after each sequence's last token, the policy-loss gradient of every tensor (PPO surrogate at ratio 1, token-mean,
advantages +-1 on the second half of each sequence: d loss = -mean(A * d log p)), and 48 greedy tokens after two
16-token prompts; in fp32 (TF32 off) and with the bf16 directory loaded in bf16.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file, load_file

# where transformers runs: the GPU machine's CUDA, else the CPU (HF_PARITY_DEVICE overrides; the CPU computes the
# transformers side, fp64 yardstick included, on a machine without a GPU)
DEV = os.environ.get("HF_PARITY_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")

FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]
# variant -> (family, tied head); the first four are the earlier table's models (same seeds), the next four the
# same families with the other head
VARIANTS = {"llama": ("llama", False), "qwen2": ("qwen2", True), "qwen3": ("qwen3", True), "mistral": ("mistral", False),
            "llama-tied": ("llama", True), "qwen2-untied": ("qwen2", False), "qwen3-untied": ("qwen3", False), "mistral-tied": ("mistral", True)}
REAL = {"smollm2": "SmolLM2-135M-Instruct (rlstream import gguf of the Q4_1 GGUF)"}
LENGTHS = [39, 64, 300]
VOCAB = 1024


def build(variant):
    import transformers as tf
    family, tied = VARIANTS[variant]
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    if family == "llama":
        # Llama 3.1's rope scaling; wavelengths of head_dim 32 at theta 5e5 fall in all three bands of 256 / 4..256
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
        cfg = tf.LlamaConfig(**common, tie_word_embeddings=tied, rope_parameters=rope)
        model = tf.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**common, tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        model = tf.Qwen2ForCausalLM(cfg)
    elif family == "qwen3":
        # head_dim 64 while hidden / heads is 32, as Qwen3 does
        cfg = tf.Qwen3Config(**common, head_dim=64, tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        model = tf.Qwen3ForCausalLM(cfg)
    else:
        cfg = tf.MistralConfig(**common, sliding_window=512, tie_word_embeddings=tied, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        model = tf.MistralForCausalLM(cfg)
    # transformers' init (std 0.02) gives near-uniform outputs, where a wrong term hides: larger weights, norms
    # away from 1, biases away from 0
    g = torch.Generator().manual_seed(list(VARIANTS).index(variant) + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.06 * torch.randn(p.shape, generator=g))
    return model.float().eval()


def inputs():
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]
    adv = [[0.0] * (n // 2) + [1.0 if torch.rand(1, generator=g).item() < 0.5 else -1.0 for _ in range(n - n // 2)] for n in LENGTHS]
    prompts = [s[:16] for s in seqs[:2]]
    return seqs, adv, prompts


def reference(model, seqs, adv, prompts, grads, autocast=False, generate=True):
    """autocast: the fp32 model's products in bf16 (torch.autocast), as mixed-precision training computes them."""
    out = {"logprobs": [], "last": [], "greedy": []}
    model.zero_grad()
    ntok = sum(1 for a in adv for x in a[:-1] if x != 0)
    wide = next(model.parameters()).dtype == torch.float64
    for s, a in zip(seqs, adv):
        ids = torch.tensor([s], device=DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids).logits[0]
        logits = logits.double() if wide else logits.float()
        lp = torch.log_softmax(logits.double(), -1)
        tgt = torch.tensor(s[1:], device=DEV)
        tok = lp[:-1].gather(1, tgt[:, None])[:, 0]
        out["logprobs"].append(tok.tolist())
        out["last"].append(lp[-1].tolist())
        if grads:
            # the PPO surrogate at ratio 1 (rlstream's behaviour log-probs are its own): -A * exp(lp - lp.detach())
            lpf = torch.log_softmax(logits, -1)[:-1].gather(1, tgt[:, None])[:, 0]
            A = torch.tensor(a[:-1], device=DEV)
            loss = -(A * torch.exp(lpf - lpf.detach())).sum() / ntok
            loss.backward()
    if not generate:
        return out
    # no end-of-sequence: every step is the arg-max over the whole vocabulary, as rlstream's greedy loop takes it
    model.generation_config.eos_token_id = None
    out["margin"] = []
    for p in prompts:
        ids = torch.tensor([p], device=DEV)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
        out["greedy"].append(gen.sequences[0, len(p):].tolist())
        # how far each step's arg-max is ahead of the runner-up (log-prob): a smaller gap than the arithmetic's
        # rounding lets another engine take the other token there
        top2 = [torch.log_softmax(sc[0].double(), -1).topk(2).values.tolist() for sc in gen.scores]
        out["margin"].append([a - b for a, b in top2])
    return out


def names_of(arg):
    names = arg.split(",") if arg else list(VARIANTS)
    for n in names:
        if n not in VARIANTS and n not in REAL:
            sys.exit(f"unknown variant {n!r}: {', '.join([*VARIANTS, *REAL])}")
    return names


def make(root, arg=None):
    import shutil
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers
    seqs, adv, prompts = inputs()
    path = os.path.join(root, "reference.json")
    ref = json.load(open(path)) if os.path.exists(path) else {"families": {}}
    ref.update({"transformers": transformers.__version__, "torch": torch.__version__, "seqs": seqs, "advantages": adv, "prompts": prompts})
    for name in names_of(arg):
        d32, d16 = os.path.join(root, name), os.path.join(root, name + "-bf16")
        if name in VARIANTS:
            model = build(name)
            for d in (d32, d16):
                shutil.rmtree(d, ignore_errors=True)
            model.save_pretrained(d32, max_shard_size="2MB")
            m16 = build(name).to(torch.bfloat16)
            m16.save_pretrained(d16, max_shard_size="1MB")
            what = f"random {VARIANTS[name][0]}, {'tied' if VARIANTS[name][1] else 'untied'} head"
        else:
            # the directories rlstream's importer wrote, as transformers reads them
            model = transformers.AutoModelForCausalLM.from_pretrained(d32, dtype=torch.float32).eval()
            what = REAL[name]
        model = model.to(DEV)
        r32 = reference(model, seqs, adv, prompts, True)
        save_file({n: p.grad.detach().float().cpu().contiguous() for n, p in model.named_parameters() if p.grad is not None}, os.path.join(root, f"grads-{name}.safetensors"))
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        # transformers against itself, the scale each tolerance is set from: its fp32 model against the same weights
        # in float64 (what fp32 rounding moves), and its fp32 model with bf16 products (torch.autocast) against fp32
        # (what bf16 products move in the gradient, which its bf16 directory, forward only, does not show)
        model.zero_grad()
        r_auto = reference(model, seqs, adv, prompts, True, autocast=True, generate=False)
        save_file({n: p.grad.detach().float().cpu().contiguous() for n, p in model.named_parameters() if p.grad is not None}, os.path.join(root, f"grads-autocast-{name}.safetensors"))
        model = model.double()
        r64 = reference(model, seqs, adv, prompts, True, generate=False)
        save_file({n: p.grad.detach().cpu().contiguous() for n, p in model.named_parameters() if p.grad is not None}, os.path.join(root, f"grads-f64-{name}.safetensors"))
        del model
        m16 = transformers.AutoModelForCausalLM.from_pretrained(d16, dtype=torch.bfloat16).to(DEV).eval()
        with torch.no_grad():
            r16 = reference(m16, seqs, adv, prompts, False)
        del m16
        ref["families"][name] = {"fp32": r32, "bf16": r16, "f64": r64, "autocast": r_auto, "files": sorted(os.listdir(d32)), "what": what, "tied": tied,
                                 "device": DEV}
        print(f"make: {name} ({what}, tied {tied}): files {sorted(os.listdir(d32))}", flush=True)
    with open(path, "w") as f:
        json.dump(ref, f)


def roundtrip(root, names):
    """transformers loads each directory rlstream exported (a trained step) and scores the sequences."""
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    seqs, _, _ = inputs()
    out = {}
    for name in names:
        d = os.path.join(root, "exported", name)
        if not os.path.isdir(d):
            continue
        m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).to(DEV).eval()
        lps = []
        with torch.no_grad():
            for s in seqs:
                lp = torch.log_softmax(m(torch.tensor([s], device=DEV)).logits[0].double(), -1)
                lps.append(lp[:-1].gather(1, torch.tensor(s[1:], device=DEV)[:, None])[:, 0].tolist())
        out[name] = {"logprobs": lps, "class": type(m).__name__, "shards": len([f for f in os.listdir(d) if f.endswith(".safetensors")])}
        del m
    return out


def worst_rel(mine, theirs):
    """The worst tensor's ||mine - theirs|| / ||theirs|| (in the wider of the two types) and its name."""
    worst, name_w = 0.0, None
    for name, g in theirs.items():
        a, b = mine[name].flatten(), g.flatten()
        dt = torch.promote_types(a.dtype, b.dtype)
        e = (a.to(dt) - b.to(dt)).norm().item() / max(b.to(dt).norm().item(), 1e-30)
        if e > worst:
            worst, name_w = e, name
    return worst, name_w


def flat(xs):
    return [v for x in xs for v in x]


def maxdiff(a, b):
    return max(abs(x - y) for x, y in zip(flat(a), flat(b)))


def compare(root, _names=None):
    ref = json.load(open(os.path.join(root, "reference.json")))
    ours = json.load(open(os.path.join(root, "rlstream.json")))
    names = [n for n in [*VARIANTS, *REAL] if n in ref["families"] and n in ours["families"]]
    rt = roundtrip(root, names)
    rows = []
    ok = True
    for fam in names:
        r, o = ref["families"][fam], ours["families"][fam]
        grads = load_file(os.path.join(root, f"grads-{fam}.safetensors"))
        # transformers against itself: its bf16 model (the bf16 directory) against its fp32 one, the scale of what
        # bf16 arithmetic moves; rlstream's CUDA layer (bf16 products) is held to twice that
        noise = {"logprob_max_abs": maxdiff(r["bf16"]["logprobs"], r["fp32"]["logprobs"]), "last_dist_max_abs": maxdiff(r["bf16"]["last"], r["fp32"]["last"])}
        rows.append({"family": fam, "tied": r["tied"], "rlstream": "(transformers bf16)", "transformers": "fp32", **noise,
                     "greedy_match": sum(1 for a, b in zip(flat(r["bf16"]["greedy"]), flat(r["fp32"]["greedy"])) if a == b), "greedy_total": len(flat(r["fp32"]["greedy"]))})
        # transformers' fp32 against float64 on the same weights, and its bf16 products' gradient against fp32: the
        # yardsticks of the fp32 and the gradient tolerances (references made before they existed: the fixed bounds)
        fp32_noise = {"logprob_max_abs": 0.0, "last_dist_max_abs": 0.0, "grad_rel_max": 0.0}
        if "f64" in r:
            g64 = load_file(os.path.join(root, f"grads-f64-{fam}.safetensors"))
            fp32_noise = {"logprob_max_abs": maxdiff(r["fp32"]["logprobs"], r["f64"]["logprobs"]), "last_dist_max_abs": maxdiff(r["fp32"]["last"], r["f64"]["last"]),
                          "grad_rel_max": worst_rel({n: g.double() for n, g in grads.items()}, g64)[0]}
            rows.append({"family": fam, "tied": r["tied"], "rlstream": "(transformers fp32)", "transformers": "float64", **fp32_noise})
        bf16_grad_noise = 0.0
        if "autocast" in r:
            bf16_grad_noise = worst_rel(load_file(os.path.join(root, f"grads-autocast-{fam}.safetensors")), grads)[0]
            rows.append({"family": fam, "tied": r["tied"], "rlstream": "(transformers fp32, bf16 products)", "transformers": "fp32", "grad_rel_max": bf16_grad_noise})
        # fp32 against fp32: 1e-4, or twice what fp32 rounding moves transformers itself from float64 where that is
        # more (a 30-layer real model's activations are larger than the 4-layer random ones')
        tol32 = {k: max(1e-4, 2 * v) for k, v in fp32_noise.items()}
        for run in ["cpu", "cuda", "cuda-plain", "cuda-bf16"]:
            if run not in o:
                continue
            x = o[run]
            base = r["bf16"] if run == "cuda-bf16" else r["fp32"]
            row = {"family": fam, "tied": r["tied"], "rlstream": run, "transformers": "bf16" if run == "cuda-bf16" else "fp32",
                   "logprob_max_abs": maxdiff(x["logprobs"], base["logprobs"]),
                   "last_dist_max_abs": maxdiff(x["last"], base["last"]),
                   "greedy_match": sum(1 for a, b in zip(flat(x["greedy"]), flat(base["greedy"])) if a == b),
                   "greedy_prefix": [next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), len(p)) for p, q in zip(x["greedy"], base["greedy"])],
                   "greedy_total": len(flat(base["greedy"]))}
            # where the greedy tokens part, transformers' gap between its two best tokens at that step
            row["margin_at_divergence"] = [base["margin"][i][k] for i, k in enumerate(row["greedy_prefix"]) if k < len(base["margin"][i])]
            gfile = os.path.join(root, f"ours-grads-{fam}-{run}.safetensors")
            if os.path.exists(gfile):
                # per tensor ||ours - theirs|| / ||theirs||, the worst tensor; a tied head's gradient is the embedding's
                row["grad_rel_max"], row["grad_worst_tensor"] = worst_rel(load_file(gfile), grads)
                row["grad_tensors"] = len(grads)
            # tolerances: fp32 against fp32 to 1e-4 (log-probs, log-distribution, gradient relative) and every greedy
            # token; bf16 products to twice transformers' own bf16 gap, 5% on the gradient, and greedy tokens
            # parting only where transformers' top two were closer than that gap
            if run == "cpu":
                row["tolerance"] = tol32["logprob_max_abs"]
                if "f64" in r:
                    row["logprob_vs_float64"] = maxdiff(x["logprobs"], r["f64"]["logprobs"])
                row["pass"] = (row["logprob_max_abs"] < tol32["logprob_max_abs"] and row["last_dist_max_abs"] < tol32["last_dist_max_abs"]
                               and row.get("grad_rel_max", 0) < tol32["grad_rel_max"] and row["greedy_match"] == row["greedy_total"])
            else:
                tol = 2 * max(noise["logprob_max_abs"], noise["last_dist_max_abs"])
                row["tolerance"] = tol
                row["grad_tolerance"] = max(0.05, 2 * bf16_grad_noise)
                row["pass"] = row["logprob_max_abs"] < tol and row["last_dist_max_abs"] < tol and row.get("grad_rel_max", 0) < row["grad_tolerance"] and all(m < tol for m in row["margin_at_divergence"])
            ok = ok and row["pass"]
            rows.append(row)
        if fam in rt:
            e = maxdiff(o["export_logprobs"], rt[fam]["logprobs"])
            rows.append({"family": fam, "tied": r["tied"], "rlstream": f"export (cpu, after a step; {rt[fam]['shards']} shards)", "transformers": f"fp32 {rt[fam]['class']}.from_pretrained",
                         "logprob_max_abs": e, "tolerance": tol32["logprob_max_abs"], "pass": e < tol32["logprob_max_abs"]})
            ok = ok and e < tol32["logprob_max_abs"]
    res = {"transformers": ref["transformers"], "torch": ref["torch"], "node": ours.get("node"), "pass": ok, "rows": rows}
    with open(os.path.join(root, "parity.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    # the table of docs/models.md, as it is pasted there
    lines = []
    for x in rows:
        num = lambda k: f"{x[k]:.1e}" if k in x else ""
        greedy = f"{x['greedy_match']}/{x['greedy_total']}" if "greedy_match" in x else ""
        if x.get("margin_at_divergence"):
            greedy += f" (parted where transformers' top two were {', '.join(f'{m:.3f}' for m in x['margin_at_divergence'])} apart)"
        verdict = "" if "pass" not in x else ("yes" if x["pass"] else "**no**") + (f" (tol. {x['tolerance']:.2g}" + (f", gradient {x['grad_tolerance']:.2g}" if "grad_tolerance" in x else "") + ")" if "tolerance" in x else "")
        lines.append(f"| {x['family']} | {'tied' if x['tied'] else 'untied'} | {x['rlstream']} | {x['transformers']} | {num('logprob_max_abs')} | {num('last_dist_max_abs')} | {num('grad_rel_max')} | {greedy} | {verdict} |")
    with open(os.path.join(root, "parity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), file=sys.stderr)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    {"make": make, "compare": compare}[sys.argv[1]](*sys.argv[2:])
