"""Where the CPU goes while an OpenAI server streams: CPU per process under closed-loop load.

    python -m bench.cpu_by_process --url http://127.0.0.1:8000 --model smollm2-135m-instruct \
        --api-key sk-demo-batch-0001 --streams 16 --seconds 40

`--streams` clients each stream one completion of `--max-tokens` tokens (ignore_eos) after
another; the CPU time of every process on the host is taken over the middle of the run (the
first and last fifth left out: ramp-up and stragglers) and printed as % of one core, busiest
first, with the tokens per second the clients received over the whole run (from each
response's usage chunk) and the chunks that carried them. Run it against
`make serve` and against a bare `vllm` server of the same model to compare what each
process costs per token (README "Where it falls short").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import psutil

PROMPT = "Tell me a long story about a cat."


def cpu_seconds() -> dict[int, tuple[str, float]]:
    out = {}
    for p in psutil.process_iter(["cmdline", "name"]):
        try:
            t = p.cpu_times()
            title = " ".join(p.info["cmdline"] or []) or p.info["name"]
            out[p.pid] = (title[:70], t.user + t.system)
        except psutil.Error:  # ended or not ours to read: not part of the figure
            continue
    return out


async def stream_until(client: httpx.AsyncClient, args, end_s: float, counts: dict) -> None:
    # Tokens from the usage chunk, not the chunk count: with vLLM's stream_interval a chunk
    # carries several tokens.
    body = {"model": args.model, "prompt": PROMPT, "max_tokens": args.max_tokens,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    while time.monotonic() < end_s:
        async with client.stream("POST", f"{args.url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise SystemExit(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[len("data: "):]).get("usage")
                    counts["chunks"] += 1
                    counts["tokens"] += (usage or {}).get("completion_tokens", 0)


async def run(args) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    counts = {"chunks": 0, "tokens": 0}
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=300, headers=headers) as client:
        load = asyncio.gather(*(stream_until(client, args, t0 + args.seconds, counts)
                                for _ in range(args.streams)))  # fmt: skip
        await asyncio.sleep(args.seconds / 5)
        before, w0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(args.seconds * 3 / 5)
        after, window_s = cpu_seconds(), time.monotonic() - w0
        await load
    wall_s = time.monotonic() - t0
    print(f"{counts['tokens']} tokens in {counts['chunks']} chunks in {wall_s:.1f} s: "
          f"{counts['tokens'] / wall_s:.1f} tokens/s ({args.streams} streams); "
          f"CPU over the middle {window_s:.0f} s, % of one core:")
    rows = sorted(((after[pid][1] - before[pid][1], after[pid][0], pid)
                   for pid in after if pid in before), reverse=True)  # fmt: skip
    for used_s, title, pid in rows:
        if used_s / window_s >= 0.005:
            print(f"{100 * used_s / window_s:6.1f}%  {pid:>7}  {title}")
    print(f"{100 * sum(r[0] for r in rows) / window_s:6.1f}%  all processes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
