"""An independent reference of keel's training engine, in PyTorch.

It reads a keel (Hugging Face layout) model directory - config.json and
model.safetensors - and implements Qwen3 and Qwen3-MoE the way Hugging Face
transformers does (written from the architecture's definition, without
transformers): per-head q_norm/k_norm before rotate-half RoPE, grouped-query
causal attention, router softmax then top-k, top-k weights renormalised when
norm_topk_prob is set, SwiGLU experts, tied or untied head. Everything runs
in float64, so the reference is more exact than the float32 engine it checks.

For given token sequences and one coefficient per predicted token it
computes log pi(y_t), the full-vocabulary entropy, the load-balancing loss
and the gradient of every parameter of

    loss = sum_t c_t log pi(y_t) + sum_t e_t H_t + aux_weight * aux_loss

with live routing or replaying given expert sets: the forced experts' gates
are recomputed from the live router softmax over all experts (never from
probabilities zeroed by the live top-k), so the router keeps its gradient.

Only PyTorch and the standard library are used (Debian: apt-get install
python3-torch; run with /usr/bin/python3).
"""

import json
import math
import os
import struct

import torch

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, size = DTYPES[info["dtype"]]
        a, b = info["data_offsets"]
        t = torch.frombuffer(bytearray(raw[base + a : base + b]), dtype=dt)
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    return out


def write_safetensors(path, tensors):
    """Writes float32 tensors (names sorted) with a space-padded header."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        b = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


class Config:
    def __init__(self, d):
        self.arch = d["architectures"][0]
        self.vocab = d["vocab_size"]
        self.hidden = d["hidden_size"]
        self.inter = d.get("intermediate_size", 0)
        self.layers = d["num_hidden_layers"]
        self.heads = d["num_attention_heads"]
        self.kv = d["num_key_value_heads"]
        self.hd = d.get("head_dim") or self.hidden // self.heads
        self.eps = d["rms_norm_eps"]
        self.theta = d["rope_theta"]
        self.tied = d.get("tie_word_embeddings", False)
        self.experts = d.get("num_experts", 0) if self.arch == "Qwen3MoeForCausalLM" else 0
        self.k = d.get("num_experts_per_tok", 0)
        self.moe_inter = d.get("moe_intermediate_size", 0)
        self.norm_topk = d.get("norm_topk_prob", False)
        self.sparse_step = d.get("decoder_sparse_step", 1)
        self.mlp_only = d.get("mlp_only_layers", []) or []

    def is_moe(self, i):
        # transformers' Qwen3MoeDecoderLayer: sparse when the layer is not in
        # mlp_only_layers, experts exist and (i + 1) % decoder_sparse_step == 0.
        return self.experts > 0 and i not in self.mlp_only and self.sparse_step > 0 and (i + 1) % self.sparse_step == 0


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config(json.load(f))
    params = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if cfg.tied:
        params.pop("lm_head.weight", None)
    for p in params.values():
        p.requires_grad_(True)
    return cfg, params


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    # x: [T, heads, hd]; rotate-half layout of transformers' Qwen3.
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None].to(torch.float64) * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    rot = torch.cat([-x2, x1], -1)
    return x * cos + rot * sin


def swiglu(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def forward(cfg, P, tokens, replay=None):
    """Runs one sequence. Returns (logp of next tokens [T-1], entropy [T-1],
    routes [T][moe layer][k] (the experts used), router probs per MoE layer
    [T, E] and the used expert ids per MoE layer [T, k])."""
    T = len(tokens)
    ids = torch.tensor(tokens)
    pos = torch.arange(T)
    x = P["model.embed_tokens.weight"][ids]
    probs_all, used_all = [], []
    routes = [[] for _ in range(T)]
    ml = 0
    for i in range(cfg.layers):
        pre = f"model.layers.{i}."
        h = rms_norm(x, P[pre + "input_layernorm.weight"], cfg.eps)
        q = (h @ P[pre + "self_attn.q_proj.weight"].T).view(T, cfg.heads, cfg.hd)
        k = (h @ P[pre + "self_attn.k_proj.weight"].T).view(T, cfg.kv, cfg.hd)
        v = (h @ P[pre + "self_attn.v_proj.weight"].T).view(T, cfg.kv, cfg.hd)
        q = rope(rms_norm(q, P[pre + "self_attn.q_norm.weight"], cfg.eps), pos, cfg.theta)
        k = rope(rms_norm(k, P[pre + "self_attn.k_norm.weight"], cfg.eps), pos, cfg.theta)
        g = cfg.heads // cfg.kv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(cfg.hd)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
        a = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, cfg.heads * cfg.hd)
        x = x + a @ P[pre + "self_attn.o_proj.weight"].T
        h = rms_norm(x, P[pre + "post_attention_layernorm.weight"], cfg.eps)
        if cfg.is_moe(i):
            p = (h @ P[pre + "mlp.gate.weight"].T).softmax(-1)  # [T, E]
            if replay is not None:
                sel = torch.tensor([replay[t][ml] for t in range(T)])
            else:
                # Descending probability, ties to the lower index.
                sel = torch.stack([torch.tensor(sorted(range(cfg.experts), key=lambda e: (-p[t, e].item(), e))[: cfg.k]) for t in range(T)])
            gates = p.gather(1, sel)  # from the full live softmax
            if cfg.norm_topk:
                gates = gates / gates.sum(-1, keepdim=True)
            out = torch.zeros_like(h)
            for e in range(cfg.experts):
                # Tokens grouped per expert, as an efficient implementation does.
                tok, slot = (sel == e).nonzero(as_tuple=True)
                if len(tok) == 0:
                    continue
                ep = pre + f"mlp.experts.{e}."
                y = swiglu(h.index_select(0, tok), P[ep + "gate_proj.weight"], P[ep + "up_proj.weight"], P[ep + "down_proj.weight"])
                out = out.index_add(0, tok, y * gates[tok, slot][:, None])
            x = x + out
            probs_all.append(p)
            used_all.append(sel)
            for t in range(T):
                routes[t].append([int(e) for e in sel[t]])
            ml += 1
        else:
            x = x + swiglu(h, P[pre + "mlp.gate_proj.weight"], P[pre + "mlp.up_proj.weight"], P[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    head = P["model.embed_tokens.weight"] if cfg.tied else P["lm_head.weight"]
    logp = (x @ head.T).log_softmax(-1)
    lp = logp[:-1].gather(1, ids[1:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)[:-1]
    return lp, ent, routes, probs_all, used_all


def aux_loss(cfg, probs, used):
    """transformers' load_balancing_loss_func over all MoE layers of all
    sequences concatenated: E * sum_e (count_e / N) * (sum_n p_n,e / N),
    count_e over (row, slot) pairs, with the experts actually used."""
    if not probs:
        return torch.zeros((), dtype=torch.float64)
    p = torch.cat(probs, 0)
    sel = torch.cat(used, 0)
    n = p.shape[0]
    counts = torch.zeros(cfg.experts, dtype=torch.float64)
    counts.index_add_(0, sel.reshape(-1), torch.ones(sel.numel(), dtype=torch.float64))
    return cfg.experts * ((counts / n) * (p.sum(0) / n)).sum()
