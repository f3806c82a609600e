#!/usr/bin/env bash
# What closes llmserve's throughput gap to bare vLLM at 16 and 64 streams? Two interleaved
# rounds of bare vLLM and llmserve in three configs (serve_config.yaml; cpu_nice 10 with a 30 s
# queue bound; cpu_nice 0 with a 30 s queue bound), then vLLM's stream_interval 4 given to both.
# About 25 minutes on the 2-core host; figures in bench/results/throughput-gap/ (README "Where
# it falls short").
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/throughput-gap tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/max_queue_wait_s: 2 /max_queue_wait_s: 30 /' serve_config.yaml > "$tmp/n10w30.yaml"
sed 's/cpu_nice: 10 /cpu_nice: 0 /' "$tmp/n10w30.yaml" > "$tmp/n0w30.yaml"
sed 's/^\( *\)scheduling_policy: priority.*/&\n\1extra: {stream_interval: 4}/' serve_config.yaml \
  > "$tmp/si4.yaml"
run() { .venv/bin/python -m bench.peers --full --scenarios sweep --concurrency 16 64 "$@"; }
for round in 1 2; do
  run --systems vllm --out-dir "$tmp/$round-vllm"
  run --systems llmserve --out-dir "$tmp/$round-default"
  run --systems llmserve --config "$tmp/n10w30.yaml" --out-dir "$tmp/$round-n10w30"
  run --systems llmserve --config "$tmp/n0w30.yaml" --out-dir "$tmp/$round-n0w30"
done
run --systems vllm llmserve --config "$tmp/si4.yaml" --out-dir "$tmp/si4"
mkdir -p "$out"
for d in "$tmp"/*/; do
  name=$(basename "$d"); [ "$name" = si4 ] && name=stream-interval-4
  cp "$d/peers_latest.json" "$out/$name.json"
done
