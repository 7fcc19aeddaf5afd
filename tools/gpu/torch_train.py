"""PyTorch's side of `keel bench --device cuda`: the same model shapes and
training step (forward over whole sequences, log-probs of the next tokens
times per-token coefficients, backward, clipping, AdamW) in Hugging Face
transformers with SDPA attention and torch.optim.AdamW(fused=True), timed
with CUDA events on the same card. Random weights: only the shapes matter.

  python3 tools/gpu/torch_train.py --preset qwen3-0.6b --seqs 4 --len 2048 --mode fp32

--micro N splits a step's sequences into micro-batches of N whose gradients
accumulate before the one optimiser step (what fits memory); --checkpoint
turns on transformers' gradient checkpointing (keel's train.recompute).
"""
import argparse
import json
import sys
import time

import torch

PRESETS = {
    # The shapes of keel's presets (model/presets.go): Qwen3's releases.
    "qwen3-0.6b": dict(moe=False, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b": dict(moe=False, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(moe=True, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, tie_word_embeddings=False,
                          num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                          decoder_sparse_step=1),
}


def build(preset, layers, vocab):
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    p = dict(PRESETS[preset])
    moe = p.pop("moe")
    if layers:
        p["num_hidden_layers"] = layers
    p.update(vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960)
    p["attn_implementation"] = "sdpa"
    if moe:
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**p))
    return Qwen3ForCausalLM(Qwen3Config(**p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--len", type=int, default=2048)
    ap.add_argument("--mode", default="fp32", choices=["fp32", "bf16"],
                    help="fp32: everything in float32 (keel's engine today; TF32 off); "
                         "bf16: fp32 master weights, bf16 autocast for the products")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=0, help="sequences per micro-batch (0: all in one)")
    ap.add_argument("--checkpoint", action="store_true", help="gradient checkpointing")
    a = ap.parse_args()
    micro = a.micro or a.seqs
    if a.seqs % micro:
        ap.error("--micro must divide --seqs")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = build(a.preset, a.layers, a.vocab).to(dev, torch.float32)
    model.train()
    if a.checkpoint:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)
    g = torch.Generator(device=dev).manual_seed(7)
    x = torch.randint(a.vocab, (a.seqs, a.len), device=dev, generator=g)
    coef = (torch.rand(a.seqs, a.len - 1, device=dev, generator=g) - 0.5) / a.seqs

    def step():
        opt.zero_grad(set_to_none=True)
        for m0 in range(0, a.seqs, micro):
            xm, cm = x[m0:m0 + micro], coef[m0:m0 + micro]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.mode == "bf16"):
                logits = model(input_ids=xm).logits
            lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, xm[:, 1:, None]).squeeze(-1)
            loss = (lp * cm).sum()
            loss.backward()
            del logits, lp, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1000)
    best = min(times)
    out = dict(preset=a.preset, layers=a.layers or PRESETS[a.preset]["num_hidden_layers"], mode=a.mode,
               micro=micro, checkpoint=a.checkpoint, tokens=a.seqs * a.len, step_s=best, tokens_per_s=a.seqs * a.len / best,
               params=sum(p.numel() for p in model.parameters()), card=torch.cuda.get_device_name(),
               peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30, torch=torch.__version__)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
