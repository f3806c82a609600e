"""bench/cpu_by_process.py against a small local streaming server: it counts the chunks the
clients received and prints a CPU line for the busy processes, this one among them."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench import cpu_by_process


async def completions(request):
    body = await request.json()

    async def events():
        for i in range(body["max_tokens"]):
            sum(range(20_000))  # some CPU per token, as a server spends
            yield f'data: {{"choices": [{{"text": "t{i}"}}]}}\n\n'
        if body["stream_options"]["include_usage"]:
            usage = {"prompt_tokens": 9, "completion_tokens": body["max_tokens"]}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def test_counts_every_chunk_and_names_the_busy_processes(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/completions", completions,
                            methods=["POST"])]), port=port, log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        args = argparse.Namespace(url=f"http://127.0.0.1:{port}", model="m", api_key=None,
                                  streams=2, seconds=1.0, max_tokens=8)  # fmt: skip
        asyncio.run(cpu_by_process.run(args))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    out = capsys.readouterr().out.splitlines()
    tokens, chunks = int(out[0].split()[0]), int(out[0].split()[3])
    assert tokens > 0 and tokens % 8 == 0  # whole completions of 8 tokens
    assert chunks == tokens // 8 * 9  # 8 token chunks and a usage chunk each; [DONE] is none
    assert "(2 streams)" in out[0]
    mine = [line for line in out if line.split()[1:2] == [str(os.getpid())]]
    assert mine and float(mine[0].split("%")[0]) > 0
    assert out[-1].endswith("all processes")
