"""keel's GPU log-probs against Hugging Face transformers on the same card.

Reads a model directory written by `keel init` (random weights, float32),
the token sequences of TOKENS.jsonl ({"tokens": [...]} per line) and
keel's log-probs in fp32 and bf16 (`keel logprobs --device cuda
--precision P`), and scores the same sequences with transformers in
float32 and in bfloat16. Prints the differences: keel fp32 against HF
fp32 (should be float32 rounding), and keel bf16 and HF bf16 each against
HF fp32 (keel's bf16 should be within the noise of transformers' own
fp32-vs-bf16 difference).

  python3 tools/gpu/hf_logprobs.py DIR TOKENS.jsonl KEEL_FP32.jsonl KEEL_BF16.jsonl
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def hf_logprobs(model_dir, seqs, dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").cuda().eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            x = torch.tensor([s], device="cuda")
            logits = m(input_ids=x).logits[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, x[0, 1:, None]).squeeze(-1)
            out.append(lp.cpu())
    del m
    torch.cuda.empty_cache()
    return out


def read(path, key):
    return [json.loads(l)[key] for l in open(path) if l.strip()]


def stats(a, b):
    d = torch.cat([(torch.as_tensor(x, dtype=torch.float64) - torch.as_tensor(y, dtype=torch.float64)).abs() for x, y in zip(a, b)])
    return d.mean().item(), d.max().item()


def main():
    model_dir, tokens, k32, k16 = sys.argv[1:5]
    seqs = read(tokens, "tokens")
    hf32 = hf_logprobs(model_dir, seqs, torch.float32)
    hf16 = hf_logprobs(model_dir, seqs, torch.bfloat16)
    rows = [("keel fp32 vs HF fp32", read(k32, "logprobs"), hf32),
            ("keel bf16 vs HF fp32", read(k16, "logprobs"), hf32),
            ("HF bf16 vs HF fp32", hf16, hf32)]
    for name, a, b in rows:
        mean, mx = stats(a, b)
        print(f"  {name}: mean |Δ log p| {mean:.3g}, max {mx:.3g} ({sum(len(x) for x in a)} tokens, {torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
