"""Steady closed-loop load over HTTP, and what became of every request.

Each client sends one request after another until told to stop; every other request streams (or
every one, `all_streams`: a stream cut mid-body cannot be retried, so it shows how the requests a
fault broke are answered). Each request carries a deadline (`"timeout"` in the body) that the
Router enforces, and the client gives up only at deadline + margin: a request still unanswered
then is a *hang*, the one outcome the platform promises never to produce. A failure is *clean*
when it is answered the way the API promises: an OpenAI-shaped JSON error, or an SSE `error`
event followed by `[DONE]`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import httpx

from bench.client import Reply, send

ROOT = Path(__file__).resolve().parents[1]
# Requests cycle through this many prompts: greedy answers to one prompt are compared, so that
# a stream resumed on another replica is seen to say what an unbroken one says.
NUM_PROMPTS = 4


@dataclass
class Result:
    model: str
    stream: bool
    start_s: float  # time.monotonic()
    end_s: float
    outcome: str  # ok | http_error | sse_error | truncated | hang | transport_error
    status: int | None = None
    clean: bool = True  # for failures: answered as the API promises
    code: str = ""  # error code, or the exception's name
    replica: str | None = None  # x-replica (the app runs with http.debug_headers)
    prompt: int = 0  # which of the NUM_PROMPTS
    resumes: int = 0  # times its stream resumed on another replica
    answer: str = ""  # a digest of the answer's text (ok replies)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def in_flight_at(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


class Load:
    """`num_clients` loops of requests for `model` at `url`; results gather in `.results`."""

    def __init__(
        self,
        url: str,
        model: str,
        num_clients: int,
        max_tokens: int,
        deadline_s: float,
        margin_s: float = 10.0,
        all_streams: bool = False,
    ) -> None:
        self.url, self.model = url, model
        self.all_streams = all_streams
        self.num_clients, self.max_tokens = num_clients, max_tokens
        self.deadline_s, self.margin_s = deadline_s, margin_s
        self.results: list[Result] = []
        self._stop = threading.Event()  # set in the client process when told to stop
        self._process: subprocess.Popen | None = None
        self._count = 0

    def start(self) -> None:
        """Runs the clients in a process of their own (`python -m chaos.load`). In a thread of
        the scenario's process they shared its GIL with Ray's blocking calls (a node start
        holds it for seconds), so on a loaded host their timers fired late and answered
        requests were counted as hangs."""
        params = dict(
            url=self.url,
            model=self.model,
            num_clients=self.num_clients,
            max_tokens=self.max_tokens,
            deadline_s=self.deadline_s,
            margin_s=self.margin_s,
            all_streams=self.all_streams,
        )
        self._process = subprocess.Popen(
            [sys.executable, "-m", "chaos.load", json.dumps(params)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> None:
        """Stops sending; waits for the requests in flight (bounded by deadline + margin)."""
        if self._process is None:
            return
        proc, self._process = self._process, None
        try:
            out, _ = proc.communicate("stop\n", timeout=self.deadline_s + self.margin_s + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the load process for {self.model} did not stop") from None
        if proc.returncode != 0:
            raise RuntimeError(f"the load process for {self.model} failed: exit {proc.returncode}")
        self.results = [Result(**r) for r in json.loads(out)]

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.num_clients * 2)
        async with httpx.AsyncClient(
            base_url=self.url, limits=limits, timeout=self.deadline_s + self.margin_s
        ) as self._client:
            await asyncio.gather(*(self._loop(k) for k in range(self.num_clients)))

    async def _loop(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            await self.one(stream=self.all_streams or (i + k) % 2 == 0)
            i += 1

    async def one(self, stream: bool) -> Result:
        n, self._count = self._count, self._count + 1
        body = {
            "model": self.model,
            "prompt": f"chaos request {n % NUM_PROMPTS}",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "timeout": self.deadline_s,
            "stream": stream,
        }
        start = time.monotonic()
        try:
            async with asyncio.timeout(self.deadline_s + self.margin_s):
                reply = await send(self._client, "/v1/completions", body)
        except TimeoutError:
            r = Result(
                self.model,
                stream,
                start,
                time.monotonic(),
                "hang",
                clean=False,
                code="client_timeout",
            )
        else:
            r = judge(self.model, stream, reply)
            r.prompt, r.resumes = n % NUM_PROMPTS, reply.resumes
            if r.ok:
                r.answer = hashlib.sha256(reply.text.encode()).hexdigest()[:12]
        self.results.append(r)
        return r


def judge(model: str, stream: bool, reply: Reply) -> Result:
    """What became of a request that got an answer or a transport error (not a hang)."""
    res = partial(Result, model, stream, reply.start_s, reply.end_s)
    if reply.exc is not None:
        # A stream cut mid-body is "truncated"; anything else never got an answer.
        cut = isinstance(reply.exc, httpx.RemoteProtocolError)
        return res(
            "truncated" if cut else "transport_error", clean=False, code=type(reply.exc).__name__
        )
    if reply.status != 200:
        code, clean = _error_code(reply.body)
        return res("http_error", reply.status, clean, code, reply.replica)
    if not stream:
        if reply.text:
            return res("ok", 200, replica=reply.replica)
        return res("empty", 200, False, "empty", reply.replica)
    if reply.sse_error is not None:
        code, _ = _error_code(reply.sse_error.encode())
        return res("sse_error", 200, reply.done, code, reply.replica)
    if reply.done and reply.finish_reason is not None:
        return res("ok", 200, replica=reply.replica)
    return res("truncated", 200, False, "no_done", reply.replica)


def _client_main(params: dict) -> None:
    """The client process: runs until a line arrives on stdin, then prints the results."""
    load = Load(**params)
    threading.Thread(target=lambda: (sys.stdin.readline(), load._stop.set()), daemon=True).start()
    asyncio.run(load._run())
    json.dump([asdict(r) for r in load.results], sys.stdout)


@contextmanager
def running(*workers):
    """Starts the loads and watches given; stops them however the block ends, so that no thread
    outlives a failed scenario (a watch would otherwise reconnect Ray to another cluster)."""
    for w in workers:
        w.start()
    try:
        yield
    finally:
        for w in workers:
            w.stop()


def _error_code(raw: bytes) -> tuple[str, bool]:
    """(error code, clean): clean when the body is the API's OpenAI-shaped error."""
    try:
        err = json.loads(raw)["error"]
        return str(err.get("code") or err.get("type") or ""), bool(err.get("message"))
    except (ValueError, KeyError, TypeError):
        return raw[:60].decode(errors="replace"), False


if __name__ == "__main__":
    _client_main(json.loads(sys.argv[1]))
