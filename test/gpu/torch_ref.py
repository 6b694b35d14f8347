# Checks the CUDA path of the native core against PyTorch on the GPU, from dumps written by test/gpu/driver.cpp:
#   torch_ref.py step <file>   one policy-loss step: logits, loss, every gradient and the AdamW update, ours (CUDA,
#                              and CPU for scale) against a float64 PyTorch reference; PyTorch's own bf16 autocast
#                              step is measured against the same reference as the yardstick
#   torch_ref.py train <file>  a training run: our loss curve (CUDA, bf16) against PyTorch's (bf16 autocast, fp32
#                              master weights, same data, same init, torch.optim.AdamW, clip_grad_norm_)
# Prints maximum errors; exit status 1 when a check fails. Skips cleanly (exit 0) without PyTorch or a GPU.
import json
import os
import sys

try:
    import torch
    from safetensors.torch import load_file
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"torch_ref.py: skipped ({e})")
    sys.exit(0)
if not torch.cuda.is_available():
    print("torch_ref.py: skipped (no CUDA GPU)")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from gpu_model import Llama, cross_entropy, packed_mask, policy_loss  # noqa: E402

dev = torch.device("cuda")
failures = 0


def meta(path):
    with safe_open(path, "pt") as f:
        return f.metadata()


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item(), (a - b).abs().max().item()


def line(what, a, b, tol=None):
    global failures
    r, m = rel(a, b)
    ok = tol is None or (r <= tol and torch.isfinite(a).all().item())
    if not ok:
        failures += 1
    print(f"{what:<62} rel {r:.2e}  max|d| {m:.2e}" + ("" if tol is None else f"  tol {tol:.0e}  {'ok' if ok else 'FAIL'}"))
    return r


def model_from(cfg, params, dtype):
    m = Llama(cfg).to(dev)
    sd = {k[len("param."):]: v for k, v in params.items() if k.startswith("param.")}
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict(sd, strict=True)
    return m.to(dtype)


def step(path):
    t = load_file(path, device="cuda")
    md = meta(path)
    cfg, lo, ao = json.loads(md["config"]), json.loads(md["loss"]), json.loads(md["adamw"])
    T, V = t["tokens"].numel(), cfg["vocab_size"]
    mask2d, pos = packed_mask(t["seq_starts"].tolist(), T, dev)
    tokens, targets = t["tokens"].long()[None], t["targets"].long()[None]
    inputs = dict(mask=t["mask"].double()[None], adv=t["advantages"].double()[None], behav=t["behaviour"].double()[None],
                  ref=t["ref"].double()[None], clip_low=lo["clip_low"], clip_high=lo["clip_high"], kl_coef=lo["kl_coef"],
                  entropy_coef=lo["entropy_coef"])

    def run(dtype, autocast):
        m = model_from(cfg, t, dtype)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = m(tokens, pos, mask2d)
            loss = policy_loss(logits, targets, **{k: (v.to(logits.dtype) if torch.is_tensor(v) and not autocast else v) for k, v in inputs.items()})
        loss.backward()
        grads = {n: p.grad.detach().double() for n, p in m.named_parameters()}
        return logits.detach().double()[0], loss.detach().double(), grads

    ref_logits, ref_loss, ref_grads = run(torch.float64, False)
    bf_logits, bf_loss, bf_grads = run(torch.float32, True)
    print("== one policy-loss step (T=%d packed in %d sequences, V=%d) against a float64 PyTorch reference ==" % (T, t["seq_starts"].numel() - 1, V))
    print("tolerances apply to rlstream CUDA (bf16 matrix work); CPU (fp32) and PyTorch bf16 autocast are shown for scale")
    line("logits        rlstream CUDA", t["cuda.logits"], ref_logits, 2e-2)
    line("logits        rlstream CPU fp32", t["cpu.logits"], ref_logits)
    line("logits        PyTorch bf16 autocast", bf_logits, ref_logits)
    print(f"loss: float64 {ref_loss.item():.6f}  rlstream CUDA {t['cuda.loss'].item():.6f}  CPU {t['cpu.loss'].item():.6f}  PyTorch bf16 {bf_loss.item():.6f}")
    line("loss          rlstream CUDA", t["cuda.loss"].double(), ref_loss.reshape(1), 1e-2)
    worst = {"cuda": (0, ""), "cpu": (0, ""), "bf16": (0, "")}
    for n, g in ref_grads.items():
        for key, ours in (("cuda", t["cuda.grad." + n]), ("cpu", t["cpu.grad." + n]), ("bf16", bf_grads[n])):
            r, _ = rel(ours, g)
            if r > worst[key][0]:
                worst[key] = (r, n)
        line("grad " + n.replace("model.", ""), t["cuda.grad." + n], g, 5e-2)
    print(f"worst gradient: rlstream CUDA {worst['cuda'][0]:.2e} ({worst['cuda'][1]}); CPU fp32 {worst['cpu'][0]:.2e}; PyTorch bf16 autocast {worst['bf16'][0]:.2e} ({worst['bf16'][1]})")
    # AdamW: PyTorch's optimizer applied to our gradients must give our update.
    upd_fail = 0
    for n in ref_grads:
        p = t["param." + n].double().clone().requires_grad_(True)
        opt = torch.optim.AdamW([p], lr=ao["lr"], betas=(ao["beta1"], ao["beta2"]), eps=ao["eps"], weight_decay=ao["weight_decay"])
        p.grad = t["cuda.grad." + n].double()
        opt.step()
        r, m = rel(t["cuda.updated." + n].double() - t["param." + n].double(), p.detach() - t["param." + n].double())
        if r > 1e-4:
            upd_fail += 1
            print(f"AdamW update {n}: rel {r:.2e} max {m:.2e} FAIL")
    global failures
    failures += upd_fail
    print(f"AdamW update vs torch.optim.AdamW on the same gradients: {len(ref_grads) - upd_fail}/{len(ref_grads)} tensors within 1e-4")


def train(path):
    t = load_file(path, device="cuda")
    md = meta(path)
    cfg, tr = json.loads(md["config"]), json.loads(md["train"])
    steps = tr["steps"]
    ours = t["losses"].double().cpu()

    def run(autocast):
        torch.manual_seed(0)
        m = model_from(cfg, t, torch.float32)
        opt = torch.optim.AdamW(m.parameters(), lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"], weight_decay=tr["weight_decay"])
        losses = []
        for s in range(steps):
            tok = t[f"tokens.{s}"].long()
            st = t[f"seq_starts.{s}"].tolist()
            T = tok.numel()
            mask2d, pos = packed_mask(st, T, dev)
            tgt = torch.full((T,), -1, dtype=torch.long, device=dev)
            for a, b in zip(st[:-1], st[1:]):
                tgt[a:b - 1] = tok[a + 1:b]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = cross_entropy(m(tok[None], pos, mask2d), tgt[None])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), tr["clip"])
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses, dtype=torch.float64)

    bf = run(True)
    fp = run(False)
    d_bf, d_fp, d_ref = (ours - bf).abs(), (ours - fp).abs(), (bf - fp).abs()
    print(f"== training curve: {steps} steps of cross-entropy, AdamW lr {tr['lr']}, clip {tr['clip']} ==")
    print("step   rlstream-cuda  torch-bf16  torch-fp32")
    for s in sorted(set([0, 1, 2, 5, 10, 20, 50, 100, 150, 200, 250, steps - 1])):
        if s < steps:
            print(f"{s:<6} {ours[s].item():<14.4f} {bf[s].item():<11.4f} {fp[s].item():.4f}")
    print(f"|ours - torch bf16|: max {d_bf.max().item():.4f} mean {d_bf.mean().item():.4f}; |ours - torch fp32|: max {d_fp.max().item():.4f}; "
          f"|torch bf16 - torch fp32|: max {d_ref.max().item():.4f} mean {d_ref.mean().item():.4f}")
    global failures
    # The curves track when our distance to PyTorch bf16 is of the order of PyTorch's own bf16-vs-fp32 distance.
    ok = d_bf.mean().item() <= max(0.02, 2 * d_ref.mean().item()) and abs(ours[-1] - bf[-1]).item() <= max(0.05, 0.05 * bf[-1].item())
    if not ok:
        failures += 1
    print(f"training curve tracks PyTorch: {'ok' if ok else 'FAIL'} (mean |d| <= max(0.02, 2 x bf16-vs-fp32 mean); final within 5%)")


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    {"step": step, "train": train}[mode](path)
    sys.exit(1 if failures else 0)
