"""Writes the golden files that train/golden_test.go holds keel to.

    /usr/bin/python3 tools/torchref/make_goldens.py [OUT_DIR]

(default OUT_DIR: train/testdata/golden). For each configuration it draws
random float32 weights (unit-scale activations, so routing and attention
are far from uniform), writes them as a Hugging Face model directory
(config.json, model.safetensors), then runs torchref in float64 on a few
sequences, live and with replayed routes, and writes case-NAME.json (inputs,
log-probs, entropies, routes, aux loss) and case-NAME.grads.safetensors
(the gradient of every parameter, by Hugging Face name).
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchref  # noqa: E402

BASE = dict(vocab_size=29, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
            rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False)

CONFIGS = {
    # head_dim 8 with 4 heads: 32 != hidden 24.
    "dense-untied": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
    "dense-tied": dict(BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True,
                       num_key_value_heads=1),
    "moe-norm": dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=5,
                     num_experts_per_tok=2, moe_intermediate_size=12, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[]),
    "moe-nonorm-tied": dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=6,
                            num_experts_per_tok=3, moe_intermediate_size=10, norm_topk_prob=False,
                            decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True),
    # A dense layer inside a MoE model, both ways.
    "moe-mlp-only": dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=12, norm_topk_prob=True,
                         decoder_sparse_step=1, mlp_only_layers=[0], num_hidden_layers=3),
    "moe-sparse-step": dict(BASE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=12, norm_topk_prob=True,
                            decoder_sparse_step=2, mlp_only_layers=[], num_hidden_layers=3),
}

LENGTHS = [7, 12, 5]


def param_shapes(c):
    cfg = torchref.Config(c)
    H, V = cfg.hidden, cfg.vocab
    qd, kvd = cfg.heads * cfg.hd, cfg.kv * cfg.hd
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg.tied:
        shapes["lm_head.weight"] = (V, H)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (qd, H), p + "self_attn.k_proj.weight": (kvd, H),
                       p + "self_attn.v_proj.weight": (kvd, H), p + "self_attn.o_proj.weight": (H, qd),
                       p + "self_attn.q_norm.weight": (cfg.hd,), p + "self_attn.k_norm.weight": (cfg.hd,)})
        if cfg.is_moe(i):
            shapes[p + "mlp.gate.weight"] = (cfg.experts, H)
            for e in range(cfg.experts):
                q = p + f"mlp.experts.{e}."
                I = cfg.moe_inter
                shapes.update({q + "gate_proj.weight": (I, H), q + "up_proj.weight": (I, H), q + "down_proj.weight": (H, I)})
        else:
            I = cfg.inter
            shapes.update({p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)})
    return shapes


def make(name, c, out, seed):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for n, shape in param_shapes(c).items():
        if len(shape) == 1:
            weights[n] = 1 + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            weights[n] = torch.randn(shape, generator=g, dtype=torch.float64) / shape[1] ** 0.5
    for n in weights:  # sharper routers: fewer near-ties in the live top-k
        if n.endswith("mlp.gate.weight"):
            weights[n] *= 3
    torchref.write_safetensors(os.path.join(d, "model.safetensors"), weights)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(c, torch_dtype="float32"), f, indent=2)
    cfg, P = torchref.load(d)  # the float32-rounded weights, as keel reads them
    tokens = [torch.randint(0, cfg.vocab, (n,), generator=g).tolist() for n in LENGTHS]
    cases = {"live": None}
    if cfg.experts:
        moe_layers = [i for i in range(cfg.layers) if cfg.is_moe(i)]
        cases["replay"] = [
            [[[int(e) for e in torch.randperm(cfg.experts, generator=g)[: cfg.k]] for _ in moe_layers] for _ in range(n)]
            for n in LENGTHS
        ]
    for case, replay in cases.items():
        for p in P.values():
            p.grad = None
        coef = [(torch.rand(n - 1, generator=g, dtype=torch.float64) - 0.5).tolist() for n in LENGTHS]
        ent = [(torch.rand(n - 1, generator=g, dtype=torch.float64) - 0.5).tolist() for n in LENGTHS]
        aux_w = 0.3 if cfg.experts else 0.0
        total = torch.zeros((), dtype=torch.float64)
        lps, ents, routes, probs, used = [], [], [], [], []
        for s, toks in enumerate(tokens):
            lp, en, rt, pr, us = torchref.forward(cfg, P, toks, None if replay is None else replay[s])
            total = total + (lp * torch.tensor(coef[s], dtype=torch.float64)).sum()
            total = total + (en * torch.tensor(ent[s], dtype=torch.float64)).sum()
            lps.append(lp.tolist())
            ents.append(en.tolist())
            routes.append(rt)
            probs += pr
            used += us
        aux = torchref.aux_loss(cfg, probs, used)
        total = total + aux_w * aux
        total.backward()
        differ = None
        if replay is not None:
            live = [torchref.forward(cfg, P, toks)[2] for toks in tokens]
            n = sum(1 for s in range(len(tokens)) for t in range(len(tokens[s])) for l in range(len(live[s][t]))
                    if set(live[s][t][l]) != set(replay[s][t][l]))
            m = sum(len(live[s][t]) for s in range(len(tokens)) for t in range(len(tokens[s])))
            differ = n / m
        doc = {"tokens": tokens, "coef": coef, "ent_coef": ent, "aux_weight": aux_w, "replay": replay,
               "logprobs": lps, "entropy": ents, "routes": routes if cfg.experts else None,
               "aux_loss": aux.item(), "replay_differs_from_live": differ}
        with open(os.path.join(d, f"case-{case}.json"), "w") as f:
            json.dump(doc, f)
        torchref.write_safetensors(os.path.join(d, f"case-{case}.grads.safetensors"),
                                   {n: p.grad for n, p in P.items()})
        print(f"{name}/{case}: loss {total.item():.6f}, aux {aux.item():.6f}" +
              (f", replayed sets differ from live on {100 * differ:.0f}% of (token, layer)" if differ is not None else ""))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "train", "testdata", "golden")
    torch.set_num_threads(1)
    for i, (name, c) in enumerate(sorted(CONFIGS.items())):
        make(name, c, out, 1000 + i)


if __name__ == "__main__":
    main()
