"""transformers' side of the GPU decode table: `generate` with a static
cache on the same model shapes, batch sizes and lengths as `keel bench
--device cuda` (random 32-token prompts, exactly 96 new tokens each,
sampling at temperature 1), timed with CUDA events on the same card.
With a static cache transformers compiles the forward (torch.compile) by
itself, which takes minutes before the first token: --compile off (the
default) turns that off (disable_compile), --compile auto leaves it on.

  python3 tools/gpu/torch_decode.py --preset qwen3-0.6b --batch 256 --dtype bf16 [--compile auto]
"""
import argparse
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from torch_train import PRESETS, build  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--compile", default="off", choices=["off", "auto"],
                    help="off: eager decoding steps; auto: transformers' own torch.compile of the static-cache forward")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    model = build(a.preset, a.layers, a.vocab).to("cuda", dtype).eval()
    # Some versions read the flag from the model's own config, others from
    # the call's: set both.
    model.generation_config.disable_compile = a.compile == "off"
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randint(a.vocab, (a.batch, a.prompt), device="cuda", generator=g)
    kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              cache_implementation="static", pad_token_id=0, disable_compile=a.compile == "off")
    with torch.no_grad():
        model.generate(x, **dict(kw, max_new_tokens=8, min_new_tokens=8))
        best = None
        for _ in range(2):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = model.generate(x, **kw)
            e.record()
            e.synchronize()
            t = s.elapsed_time(e) / 1000
            best = t if best is None else min(best, t)
    n = a.batch * (out.shape[1] - a.prompt)
    print(json.dumps(dict(preset=a.preset, layers=a.layers or PRESETS[a.preset]["num_hidden_layers"], dtype=a.dtype,
                          batch=a.batch, compile=a.compile, new_tokens=int(out.shape[1] - a.prompt), tokens_per_s=n / best, seconds=best,
                          card=torch.cuda.get_device_name(), transformers=__import__("transformers").__version__)))


if __name__ == "__main__":
    main()
