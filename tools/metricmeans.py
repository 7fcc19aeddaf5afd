#!/usr/bin/env python3
"""Means over a run's steps of metrics.jsonl keys, and its last held-out score.

    python3 tools/metricmeans.py RUN_DIR... [--keys k1,k2,...]

One line per run: the final eval/avg@8 and, for each key, the mean of its
values over the steps that logged it (REPRODUCTION.md's asynchrony table).
"""
import json
import statistics
import sys

keys = ["train_infer/k3", "is/max", "surrogate/gap"]
dirs = []
args = sys.argv[1:]
while args:
    a = args.pop(0)
    if a == "--keys":
        keys = args.pop(0).split(",")
    else:
        dirs.append(a)
for d in dirs:
    recs = [json.loads(line) for line in open(d + "/metrics.jsonl")]
    evals = [r["eval/avg@8"] for r in recs if "eval/avg@8" in r]
    cells = [d, "final %.3f" % evals[-1] if evals else "final -"]
    for k in keys:
        v = [r[k] for r in recs if k in r and r.get("step", 0) > 0]
        cells.append("%s %.4g" % (k, statistics.mean(v)) if v else k + " -")
    print("  ".join(cells))
