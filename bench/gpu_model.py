# The policy model of rlstream's native core (Llama / Qwen2 family) in plain PyTorch, with Hugging Face parameter
# names: the reference of the GPU checks (test/gpu/torch_ref.py) and the PyTorch side of the GPU benchmark
# (bench/gpu_torch.py). Written like a Hugging Face eager model: RMSNorm in fp32, rotary in the activation dtype,
# scaled_dot_product_attention, SwiGLU, and the policy loss computed from full logits.

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, NH, NKV = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.nh, self.nkv, self.hd = NH, NKV, H // NH
        bias = bool(c.get("attention_bias", False))
        self.q_proj = nn.Linear(H, NH * self.hd, bias=bias)
        self.k_proj = nn.Linear(H, NKV * self.hd, bias=bias)
        self.v_proj = nn.Linear(H, NKV * self.hd, bias=bias)
        self.o_proj = nn.Linear(NH * self.hd, H, bias=False)

    def forward(self, x, cos, sin, mask):
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, L, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.nkv, self.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, L, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, tokens, pos, mask=None):
        """tokens, pos [B, L]; mask None (causal within each row) or a bool [L, L] (True = attend)."""
        c = self.c
        hd = c["hidden_size"] // c["num_attention_heads"]
        x = self.model.embed_tokens(tokens)
        # inverse frequencies rounded to float32 like HF, angles in the activation dtype of the reference
        inv = (1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, device=tokens.device, dtype=torch.float64) / hd))).float()
        adt = torch.float64 if x.dtype == torch.float64 else torch.float32
        freqs = pos[..., None].to(adt) * inv.to(adt)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))


def packed_mask(seq_starts, T, device):
    """Block-diagonal causal mask of packed sequences (True = attend) and the positions [1, T]."""
    seq = torch.zeros(T, dtype=torch.long, device=device)
    pos = torch.zeros(T, dtype=torch.long, device=device)
    for s in range(len(seq_starts) - 1):
        a, b = int(seq_starts[s]), int(seq_starts[s + 1])
        seq[a:b] = s
        pos[a:b] = torch.arange(b - a, device=device)
    i = torch.arange(T, device=device)
    mask = (seq[:, None] == seq[None, :]) & (i[None, :] <= i[:, None])
    return mask, pos[None]


def logprobs_entropy(logits, targets):
    lp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    logp = lp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1) * (targets >= 0)
    ent = -(lp.exp() * lp).sum(-1)
    return logp, ent


def policy_loss(logits, targets, mask, adv, behav, ref=None, clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.0):
    """verl compute_policy_loss (PPO clip, token-mean) + k3 KL to a reference + entropy bonus."""
    logp, ent = logprobs_entropy(logits, targets)
    ratio = torch.exp(torch.clamp(logp - behav, -20, 20))
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    msum = mask.sum()
    agg = lambda v: (v * mask).sum() / msum  # noqa: E731
    loss = agg(pg) - entropy_coef * agg(ent)
    if ref is not None and kl_coef:
        x = torch.clamp(logp - ref, -20, 20)
        loss = loss + kl_coef * agg(torch.clamp(torch.exp(-x) + x - 1, -10, 10))
    return loss


def cross_entropy(logits, targets):
    lp = torch.log_softmax(logits.float(), dim=-1)
    valid = targets >= 0
    nll = -lp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    return (nll * valid).sum() / valid.sum()


def step_flops(c, seqs, length):
    """Model FLOPs of one training step: 6 per matmul weight per token + causal attention (forward x3)."""
    H = c["hidden_size"]
    hd = H / c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    per_layer = H * H * 2 + H * kv * 2 + 3 * H * c["intermediate_size"]
    matmul_params = per_layer * c["num_hidden_layers"] + c["vocab_size"] * H
    T = seqs * length
    pairs = seqs * length * (length + 1) / 2
    return 6 * matmul_params * T + 3 * 4 * H * pairs * c["num_hidden_layers"]


