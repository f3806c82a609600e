"""Asks every model of a running platform the README's chat question, through the OpenAI SDK.

    .venv/bin/python -m bench.ask_models                       # the models /v1/models lists
    .venv/bin/python -m bench.ask_models --models smollm2-135m-instruct-int8 --wait-s 600

Waits for /readyz (every model has a running replica), then asks each model, one after the
other, "What is the capital of France?" with the system prompt of the README's example, greedy,
and prints the answer and whether it mentions Paris. Exits 1 if a model gives no answer (an
answer without Paris is printed, not failed: for a 4-bit 135M model that is a quality figure,
which bench/quant_report.py measures properly). bench/quant_report_cuda.sh runs it against the
GPU deployment; it works the same against `make serve`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import httpx
import openai

SYSTEM_PROMPT = "You are a helpful assistant."
QUESTION = "What is the capital of France?"


def wait_ready(url: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/readyz", timeout=10)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:300]}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(2)
    raise SystemExit(f"not ready after {wait_s:.0f} s: {last}")


def ask(client: openai.OpenAI, model: str) -> str:
    resp = client.chat.completions.create(
        model=model,
        temperature=0,
        max_tokens=32,
        messages=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": QUESTION},
        ],
    )
    return resp.choices[0].message.content or ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("LLMSERVE_API_KEY"),
        help="a tenant's key (default $LLMSERVE_API_KEY; none: anonymous, where the app allows it)",
    )
    parser.add_argument("--models", nargs="*", help="default: every model /v1/models lists")
    parser.add_argument("--wait-s", type=float, default=300.0, help="how long to wait for /readyz")
    parser.add_argument(
        "--timeout-s", type=float, default=120.0, help="how long one answer may take"
    )
    args = parser.parse_args(argv)
    wait_ready(args.url, args.wait_s)
    # No key: no Authorization header at all (the SDK would send a bearer of its own).
    no_key = {} if args.api_key else {"Authorization": ""}
    client = openai.OpenAI(
        base_url=f"{args.url}/v1",
        api_key=args.api_key or "none",
        default_headers=no_key,
        max_retries=0,
        timeout=args.timeout_s,
    )
    models = args.models or [m.id for m in client.models.list().data]
    failed = []
    for model in models:
        try:
            answer = ask(client, model)
        except openai.OpenAIError as e:
            print(f"{model}: FAILED {e}", flush=True)
            failed.append(model)
            continue
        paris = "Paris" if "paris" in answer.lower() else "no Paris"
        print(f"{model}: [{paris}] {answer!r}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
