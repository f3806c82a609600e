"""Every option tried for the token path, measured side by side: bench.relay_cost with each as a
variant, beside the commit before this work. Its figures land in bench/results/relay_cost.md,
one row per option, with whether it is kept and why.

    .venv/bin/python -m bench.options [--seconds 20] [--repeat 2]
"""

from __future__ import annotations

import json
import sys

from bench import relay_cost

BASE = "075fb12"  # the last commit with the hand-written protocol and one Ray item per token
SERVE_DEFAULTS = {"BENCH_SERVE_DEFAULTS": "1"}
OPTIONS = {
    "flush-50": (
        {"deployment": {"stream_flush_ms": 50}},
        {},
        "not the default: fewer items, so less relay CPU per token at GPU rates, but each "
        "stream's text comes in 50 ms lumps",
    ),
    "flush-100": (
        {"deployment": {"stream_flush_ms": 100}},
        {},
        "not the default: less CPU again, but each stream's text comes in 100 ms lumps",
    ),
    "serve-defaults": (
        {},
        SERVE_DEFAULTS,
        "rejected: Serve's defaults, its Python proxy in the token path",
    ),
    "grpc-only": (
        {},
        {**SERVE_DEFAULTS, "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1"},
        "rejected: gRPC between deployments halves the per-item cost, but the Python "
        "proxy stays in the path",
    ),
    "no-shield": (
        {"admission": {"shield_factor": 0}},
        {},
        "rejected: without HAProxy's shield (llmserve/router/shield.py) every refusal of a flood "
        "is the Router's, at about ten times the CPU",
    ),
    "direct-no-haproxy": (
        {},
        {"RAY_SERVE_ENABLE_HA_PROXY": "0", "BENCH_CLIENT_PORT": "30000"},
        "rejected: as cheap as HAProxy, but the Router's own port moves when "
        "Serve replaces it (restart, rolling update): no stable API port",
    ),
}


def main() -> None:
    variants = [
        f"{name}:" + json.dumps({**app, "env": e, "what": what})
        for name, (app, e, what) in OPTIONS.items()
    ]
    args = sys.argv[1:] + ["--base", BASE]
    for v in variants:
        args += ["--variant", v]
    relay_cost.main(args)


if __name__ == "__main__":
    main()
