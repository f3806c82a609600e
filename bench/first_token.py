"""Where one stream's first token spends its time on the way through the platform, by span.

llmserve runs on the real default model as `make bench` starts it, with tracing to a file (whose
lines carry the replica's `first_token` event). A sequential client sends streamed completions,
each with a `traceparent` of its own, and notes its wall clock at the send and at the first
token; the spans of the same trace then split that time into phases:

- `to_router`: the client's send to the Router's first span (the client, HAProxy, uvicorn and
  Serve's direct-ingress wrapper);
- `router`: the Router before dispatch (key, body, admission);
- `hop`: dispatch to the replica's span (Serve's handle and request router, gRPC, the
  replica's side of Serve);
- `engine`: the replica's span to its first token (vLLM's serving layer and the engine: what
  `vllm serve` does for the whole of its first token);
- `back`: the replica's first token to the Router;
- `to_client`: the Router to the client.

    .venv/bin/python -m bench.first_token [--requests 80] [--out bench/results/first_token.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("to_router", "router", "hop", "engine", "back", "to_client")
WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper", "green", "seven")


def phases(sent_ns: int, first_ns: int, spans: Iterable[dict[str, Any]]) -> dict[str, float] | None:
    """One request's phases in ms from its trace's spans (JsonLinesSpanExporter's lines) and the
    client's clock; None where a span is missing (a refusal, a retry)."""
    by_name = {s["name"]: s for s in spans}
    root = next((s for name, s in by_name.items() if name.startswith("POST ")), None)
    dispatch, generate = by_name.get("dispatch"), by_name.get("llmserver.generate")
    if root is None or dispatch is None or generate is None:
        return None
    first = [e["ns"] for e in generate.get("events", ()) if e["name"] == "first_token"]
    if not first:
        return None
    marks = (
        sent_ns,
        root["start_ns"],
        dispatch["start_ns"],
        generate["start_ns"],
        first[0],
        dispatch["end_ns"],
        first_ns,
    )
    return {p: (b - a) / 1e6 for p, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True)}


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for p in (*PHASES, "total"):
        xs = sorted(r[p] if p != "total" else sum(r[q] for q in PHASES) for r in rows)
        out[p] = {
            "p50": round(statistics.median(xs), 2),
            "p10": round(xs[len(xs) // 10], 2),
            "p90": round(xs[9 * len(xs) // 10], 2),
        }
    return out


def report(doc: dict[str, Any]) -> str:
    lines = [
        "# One stream's first token, by span (`python -m bench.first_token`)",
        "",
        f"Generated from {doc['file']}: commit {doc['commit']}, {doc['date']}, {doc['machine']}. "
        f"{doc['requests']} sequential streamed completions ({doc['prompt_words']}-word prompts, "
        f"{doc['max_tokens']} tokens) through HAProxy to the default model; ms.",
        "",
        "| phase | p50 | p10 | p90 |",
        "|---|---|---|---|",
    ]
    for p, q in doc["phases"].items():
        lines.append(f"| {p} | {q['p50']} | {q['p10']} | {q['p90']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--prompt-words", type=int, default=120)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--port", type=int, default=18560)
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/first_token.json")
    args = p.parse_args()

    import httpx

    from bench.peers import systems
    from bench.peers.machine import commit_stamp, cpu_label, cpu_model, vector_extensions
    from bench.peers.spec import TENANTS, resolve_model

    work = Path(f"/tmp/llmserve-first-token-{args.port}")
    work.mkdir(parents=True, exist_ok=True)
    spans_path = work / "spans.jsonl"
    spans_path.unlink(missing_ok=True)
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["applications"][0]["args"]["tracing"] = {
        "exporter": "file",
        "file_path": str(spans_path),
    }
    config_path = work / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    doc: dict[str, Any] = {
        "commit": commit_stamp(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{cpu_label(cpu_model(), vector_extensions())}",
        "requests": args.requests,
        "prompt_words": args.prompt_words,
        "max_tokens": args.max_tokens,
        "file": args.out.name,
    }
    model = resolve_model(ROOT / "serve_config.yaml")
    platform = systems.Platform(model, args.port, work, config_path)
    platform.start()
    clock: dict[str, tuple[int, int]] = {}  # trace id -> (sent, first token), wall ns
    rng = random.Random(0)
    try:
        platform.wait_ready(900)
        time.sleep(15)  # past the start's own work
        headers = {"Authorization": f"Bearer {TENANTS.standard}"}
        with httpx.Client(base_url=platform.base_url, timeout=60, headers=headers) as client:
            for _ in range(args.requests):
                trace_id = f"{rng.getrandbits(128):032x}"
                body = {
                    "model": model.name,
                    "prompt": " ".join(rng.choice(WORDS) for _ in range(args.prompt_words)),
                    "max_tokens": args.max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
                parent = {"traceparent": f"00-{trace_id}-{rng.getrandbits(64):016x}-01"}
                sent = time.time_ns()
                with client.stream("POST", "/v1/completions", json=body, headers=parent) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            clock[trace_id] = (sent, time.time_ns())
                            break
        time.sleep(6)  # the span processor's batch
    finally:
        platform.stop()
    traces = collections.defaultdict(list)
    for line in spans_path.read_text().splitlines():
        span = json.loads(line)
        traces[span["trace_id"]].append(span)
    rows = [r for t, (a, b) in clock.items() if (r := phases(a, b, traces[t])) is not None]
    doc["split"] = len(rows)
    doc["phases"] = summary(rows)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(doc))
    print(report(doc))


if __name__ == "__main__":
    main()
