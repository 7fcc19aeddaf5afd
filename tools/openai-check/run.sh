#!/usr/bin/env bash
# Drives `keel serve` with the unmodified openai npm package (check.mjs):
# builds keel, serves models/tiny-moe-base on a free port with a random API
# key, runs the check with the package-lock.json's openai (npm ci), then
# stops the server with SIGTERM, which must drain and exit 0. Exits non-zero
# if anything fails. Called by .ci/run; needs Node and npm (installed with
# apt-get when missing) and the npm registry.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
start=$SECONDS

die() {
  echo "openai-check: FAIL: $*" >&2
  exit 1
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "openai-check: node/npm not found; installing Debian's nodejs and npm"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >/dev/null 2>&1 || true
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    die "node and npm are required (the OpenAI-client check is part of CI) and could not be installed; install Node.js >= 20 with npm"
  fi
fi
sdk=$(sed -n 's/.*"openai": *"\([^"]*\)".*/\1/p' "$here/package.json")
node_major=$(node -p 'process.versions.node.split(".")[0]')
echo "openai-check: Node $(node --version), npm $(npm --version), openai $sdk"
if [ "$node_major" -lt 22 ]; then
  echo "openai-check: note: openai $sdk declares Node >= 22 (npm's EBADENGINE warning); this check is what says it runs here"
fi

tmp=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/keel" ./cmd/keel

key="keel-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
KEEL_API_KEY="$key" "$tmp/keel" serve --model models/tiny-moe-base --addr 127.0.0.1:0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
pid=$!

# npm ci while the server loads.
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci in tools/openai-check failed"

serverlog() {
  echo "--- keel serve stdout:" >&2
  cat "$tmp/serve.out" >&2
  echo "--- keel serve stderr:" >&2
  cat "$tmp/serve.err" >&2
}

# The address: keel serve prints "... on http://HOST:PORT" once listening.
url=
for _ in $(seq 300); do
  url=$(sed -n 's/.* on \(http:\/\/[^ ]*\)$/\1/p' "$tmp/serve.out" | head -n 1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { serverlog; die "keel serve exited before listening"; }
  sleep 0.1
done
[ -n "$url" ] || { serverlog; die "keel serve printed no address within 30 s"; }

# Wait until it answers.
ready=
for _ in $(seq 100); do
  if KEEL_URL="$url" KEEL_API_KEY="$key" node -e '
      fetch(process.env.KEEL_URL + "/health", {headers: {Authorization: "Bearer " + process.env.KEEL_API_KEY}})
        .then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' 2>/dev/null; then
    ready=1
    break
  fi
  kill -0 "$pid" 2>/dev/null || { serverlog; die "keel serve exited"; }
  sleep 0.1
done
[ -n "$ready" ] || { serverlog; die "keel serve at $url did not answer /health"; }

status=0
(cd "$here" && KEEL_URL="$url" KEEL_API_KEY="$key" KEEL_MODEL=tiny-moe-base node check.mjs) || status=$?

# SIGTERM: keel serve drains and must exit 0.
kill -TERM "$pid"
serve_status=0
wait "$pid" || serve_status=$?
pid=
if [ "$serve_status" -ne 0 ] || ! grep -q '^keel serve: stopped$' "$tmp/serve.out"; then
  serverlog
  die "keel serve exited with status $serve_status after SIGTERM (want 0 after draining)"
fi
echo "ok   keel serve drained and exited 0 on SIGTERM"

if [ "$status" -ne 0 ]; then
  serverlog
  die "the openai $sdk client check failed (status $status)"
fi
echo "openai-check: passed in $((SECONDS - start)) s"
