"""PyTorch side of keel's speed comparison (tools/torchref/bench.sh runs
both and prints the table). Written as a good PyTorch user would:

- float32 modules, whole batches at once ([B, T] with a causal mask);
- MoE experts on grouped tokens: index_select the tokens routed to each
  expert, run its SwiGLU once, index_add the gated outputs back;
- forward-only timing under torch.inference_mode();
- training step = forward, backward, torch.optim.AdamW (foreach);
- decoding with a preallocated KV cache (all sequences step together,
  which favours PyTorch: no continuous-batching bookkeeping), sampling with
  torch.multinomial at temperature 1;
- torch.set_num_threads(2); the script that calls this sets the library
  environment: OpenBLAS's OpenMP build on its AVX-512 kernels and tcmalloc.

Prints one JSON object with tokens/s per row.
"""

import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "tiny-dense": dict(hidden=128, layers=4, heads=4, kv=2, hd=32, inter=384, experts=0, k=0, moe_inter=0, tied=True),
    "tiny-moe": dict(hidden=128, layers=4, heads=4, kv=2, hd=32, inter=384, experts=8, k=2, moe_inter=128, tied=True),
    "small-moe": dict(hidden=256, layers=8, heads=8, kv=4, hd=32, inter=768, experts=16, k=4, moe_inter=256, tied=False),
}


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


def rope_tables(hd, n, theta=1e6):
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()


def rope(x, cos, sin):  # x [B, h, T, hd], cos/sin [T, hd]
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.h, self.kv, self.hd = c["hidden"], c["heads"], c["kv"], c["hd"]
        self.qkv = nn.Linear(H, (self.h + 2 * self.kv) * self.hd, bias=False)
        self.o = nn.Linear(self.h * self.hd, H, bias=False)
        self.qn, self.kn = RMSNorm(self.hd), RMSNorm(self.hd)

    def forward(self, x, cos, sin, cache=None, pos=0):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
        q = rope(self.qn(q.view(B, T, self.h, self.hd)).transpose(1, 2), cos[pos:pos + T], sin[pos:pos + T])
        k = rope(self.kn(k.view(B, T, self.kv, self.hd)).transpose(1, 2), cos[pos:pos + T], sin[pos:pos + T])
        v = v.view(B, T, self.kv, self.hd).transpose(1, 2)
        if cache is not None:
            kc, vc = cache
            kc[:, :, pos:pos + T] = k
            vc[:, :, pos:pos + T] = v
            k, v = kc[:, :, :pos + T], vc[:, :, :pos + T]
        g = self.h // self.kv
        q = q.reshape(B, self.kv, g * T, self.hd)  # heads of a group share K, V
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd)
        S = k.shape[2]
        if T > 1:
            mask = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
            s = s.view(B, self.kv, g, T, S).masked_fill(mask, float("-inf")).view(B, self.kv, g * T, S)
        a = (s.softmax(-1) @ v).view(B, self.h, T, self.hd).transpose(1, 2).reshape(B, T, -1)
        return self.o(a)


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gu = nn.Linear(H, 2 * I, bias=False)
        self.down = nn.Linear(I, H, bias=False)

    def forward(self, x):
        g, u = self.gu(x).chunk(2, -1)
        return self.down(F.silu(g) * u)


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.router = nn.Linear(c["hidden"], c["experts"], bias=False)
        self.experts = nn.ModuleList(MLP(c["hidden"], c["moe_inter"]) for _ in range(c["experts"]))
        self.k = c["k"]

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        p = self.router(x).softmax(-1)
        w, sel = p.topk(self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, ex in enumerate(self.experts):
            tok, slot = (sel == e).nonzero(as_tuple=True)
            if tok.numel():
                out.index_add_(0, tok, ex(x.index_select(0, tok)) * w[tok, slot, None])
        return out.view(shape)


class Model(nn.Module):
    def __init__(self, c, vocab):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(vocab, c["hidden"])
        self.layers = nn.ModuleList()
        for _ in range(c["layers"]):
            layer = nn.Module()
            layer.n1, layer.n2 = RMSNorm(c["hidden"]), RMSNorm(c["hidden"])
            layer.attn = Attention(c)
            layer.mlp = MoE(c) if c["experts"] else MLP(c["hidden"], c["inter"])
            self.layers.append(layer)
        self.norm = RMSNorm(c["hidden"])
        self.head = nn.Linear(c["hidden"], vocab, bias=False)
        if c["tied"]:
            self.head.weight = self.embed.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        self.cos, self.sin = rope_tables(c["hd"], 4096)

    def forward(self, ids, caches=None, pos=0):
        x = self.embed(ids)
        for i, l in enumerate(self.layers):
            x = x + l.attn(l.n1(x), self.cos, self.sin, None if caches is None else caches[i], pos)
            x = x + l.mlp(l.n2(x))
        return self.head(self.norm(x))


def best(f, tokens, seconds=2.0):
    f()
    t_end = time.time() + seconds
    rate = 0
    n = 0
    while n < 2 or time.time() < t_end:
        t = time.time()
        f()
        rate = max(rate, tokens / (time.time() - t))
        n += 1
    return rate


def bench_train(preset, vocab, seqs=16, length=128):
    torch.manual_seed(0)
    m = Model(PRESETS[preset], vocab)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, foreach=True)
    ids = torch.randint(0, vocab, (seqs, length))
    coef = (torch.rand(seqs, length - 1) - 0.5) / seqs

    def step():
        opt.zero_grad(set_to_none=True)
        lp = m(ids).log_softmax(-1)[:, :-1]
        loss = -(lp.gather(-1, ids[:, 1:, None])[..., 0] * coef).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    def fwd():
        with torch.inference_mode():
            lp = m(ids).log_softmax(-1)[:, :-1]
            lp.gather(-1, ids[:, 1:, None])
            (-(lp.exp() * lp).sum(-1))  # entropy, as keel's forward computes it

    return best(fwd, seqs * length), best(step, seqs * length)


def bench_decode(preset, vocab, slots, prompt=32, new=96):
    torch.manual_seed(0)
    c = PRESETS[preset]
    m = Model(c, vocab)
    ids = torch.randint(0, vocab, (slots, prompt))

    def run():
        with torch.inference_mode():
            caches = [(torch.empty(slots, c["kv"], prompt + new, c["hd"]), torch.empty(slots, c["kv"], prompt + new, c["hd"]))
                      for _ in range(c["layers"])]
            logits = m(ids, caches, 0)[:, -1]
            pos = prompt
            for _ in range(new):
                tok = torch.multinomial(logits.softmax(-1), 1)
                logits = m(tok, caches, pos)[:, -1]
                pos += 1

    return best(run, slots * new, seconds=1.0)


def main():
    torch.set_num_threads(2)
    out = {"torch": torch.__version__, "train": {}, "forward": {}, "decode": {}}
    for preset, vocab in [("tiny-dense", 128), ("tiny-moe", 128), ("small-moe", 128), ("small-moe", 4096)]:
        f, t = bench_train(preset, vocab)
        out["forward"][f"{preset}/{vocab}"] = f
        out["train"][f"{preset}/{vocab}"] = t
        print(f"{preset} vocab {vocab}: forward {f:.0f} tok/s, train {t:.0f} tok/s", file=sys.stderr)
    for preset in ["tiny-dense", "tiny-moe", "small-moe"]:
        for slots in [64, 256]:
            d = bench_decode(preset, 128, slots)
            out["decode"][f"{preset}/{slots}"] = d
            print(f"{preset} decode {slots}: {d:.0f} tok/s", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
