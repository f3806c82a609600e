"""The load generator: vLLM's own `vllm.benchmarks.serve`, the same client for every system.

`run_bench()` builds its command line with `add_cli_args` and runs `main_async` in this process
(stdout to a log file), and returns per-request records next to vLLM's own aggregates. The mixed
scenario needs two classes of traffic at once with a closed loop that runs until told to stop,
which `main_async` cannot do; `stream_request()` sends one request through the very request
function `main_async` uses, so TTFT and TPOT are measured the same way in every scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import http
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.peers.spec import Model, Workload

# vLLM's request function reports an HTTP error by its reason phrase only.
_STATUS_BY_PHRASE = {s.phrase: s.value for s in http.HTTPStatus}


@dataclass(frozen=True)
class Req:
    """One request as the client saw it. status 0: no HTTP status (connection error, a stream
    that broke or never produced a token)."""

    status: int
    start_s: float  # perf_counter at send
    ttft_s: float | None
    latency_s: float | None
    output_tokens: int

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.output_tokens <= 1:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@contextlib.contextmanager
def _errors_timed(backend: str):
    """vLLM's request function times only the answers it got: a refusal (429/503) comes back
    with latency 0. For the run, its entry in vLLM's table of request functions gives every
    failed request the seconds from send to the error, so a refusal's latency is measured."""
    from vllm.benchmarks.lib.endpoint_request_func import ASYNC_REQUEST_FUNCS

    original = ASYNC_REQUEST_FUNCS[backend]

    async def timed(request_func_input, session, pbar=None):
        out = await original(request_func_input, session, pbar=pbar)
        if not out.success:
            out.latency = time.perf_counter() - out.start_time
        return out

    ASYNC_REQUEST_FUNCS[backend] = timed
    try:
        yield
    finally:
        ASYNC_REQUEST_FUNCS[backend] = original


def status_of(error: str) -> int:
    if not error:
        return 200
    return _STATUS_BY_PHRASE.get(error.strip(), 0)


def bench_args(
    base_url: str,
    model: Model,
    w: Workload,
    *,
    num_prompts: int,
    max_concurrency: int | None = None,
    request_rate: float | None = None,
    output_len: int | None = None,
    seed: int | None = None,
    api_key: str | None = None,
) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = [
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model.name,
        "--served-model-name",
        model.name,
        "--tokenizer",
        str(model.path),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(w.input_len),
        "--random-output-len",
        str(output_len or w.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(num_prompts),
        "--seed",
        str(w.seed if seed is None else seed),
        "--temperature",
        "0",
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--goodput",
        f"ttft:{w.ttft_slo_ms:g}",
        f"tpot:{w.tpot_slo_ms:g}",
        "--save-detailed",  # keeps per-request lists in the returned dict (nothing is written)
    ]
    if max_concurrency:
        argv += ["--max-concurrency", str(max_concurrency)]
    if request_rate:
        argv += ["--request-rate", f"{request_rate:.4f}"]
    if api_key:  # this platform picks the tenant by key; the peers ignore the header
        argv += ["--header", f"Authorization=Bearer {api_key}"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(argv)


async def run_bench(args: argparse.Namespace, log_path: Path) -> tuple[dict[str, Any], list[Req]]:
    """One `vllm.benchmarks.serve` run; returns vLLM's aggregates and the per-request records."""
    from vllm.benchmarks.serve import main_async

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "a") as log,
        contextlib.redirect_stdout(log),
        _errors_timed(args.backend),
    ):
        print(f"\n===== {time.strftime('%H:%M:%S')} {vars(args).get('num_prompts')} prompts")
        result = await main_async(args)
    reqs = [
        Req(status_of(err), start, ttft if not err else None, lat, n)
        for err, start, ttft, lat, n in zip(
            result["errors"],
            result["start_times"],
            result["ttfts"],
            result["latencies"],
            result["output_lens"],
        )
    ]
    aggregates = {k: v for k, v in result.items() if not isinstance(v, list)}
    return aggregates, reqs


def samples(model: Model, w: Workload, num: int, output_len: int, seed: int):
    """Random-token prompts exactly as `vllm.benchmarks.serve --dataset-name random` makes them."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    args = bench_args("http://unused", model, w, num_prompts=num, output_len=output_len, seed=seed)
    return get_samples(args, get_tokenizer(str(model.path)))


def client_session() -> aiohttp.ClientSession:
    # As in vllm.benchmarks.serve: no connection limit, a timeout far beyond any run.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=6 * 3600)
    )


async def stream_request(
    session: aiohttp.ClientSession, base_url: str, model: Model, sample, api_key: str
) -> Req:
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    out = await async_request_openai_completions(
        RequestFuncInput(
            prompt=sample.prompt,
            api_url=base_url + "/v1/completions",
            prompt_len=sample.prompt_len,
            output_len=sample.expected_output_len,
            model=model.name,
            model_name=model.name,
            ignore_eos=True,
            extra_headers={"Authorization": f"Bearer {api_key}"},
            extra_body={"temperature": 0},
        ),
        session,
    )
    status = status_of(out.error) if not out.success else 200
    if not out.success and status == 200:
        status = 0
    return Req(
        status,
        out.start_time,
        out.ttft if out.success else None,
        out.latency if out.success else time.perf_counter() - out.start_time,
        out.output_tokens or 0,
    )
