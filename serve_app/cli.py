"""`llmserve` command line: prepare models named in a Serve config, check a config.

    llmserve prepare serve_config.yaml   # convert packaged models into the cache (idempotent)
    llmserve check serve_config.yaml     # validate args and model sources, print the models
    llmserve status [--url http://127.0.0.1:8000] [--metrics-url http://127.0.0.1:8080/metrics]
                    [--interval 2] [--once]  # live per-model view: replicas, queue, TTFT, tokens/s
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from serve_app import model_source
from serve_app.config import AppConfig


def app_configs(path: Path) -> list[AppConfig]:
    """The AppConfig of every application in a Serve config file that uses build_app."""
    doc = yaml.safe_load(path.read_text()) or {}
    apps = doc.get("applications", [])
    return [
        AppConfig.model_validate(a.get("args") or {})
        for a in apps
        if str(a.get("import_path", "")).startswith("serve_app.app")
    ]


def _prepare(config: AppConfig) -> None:
    cache = config.cache_dir()
    for m in config.models:
        src = model_source.check(m, cache)
        if src.kind == "pypi":
            gguf = model_source.packaged_gguf(src.value)
            path = model_source.prepare_packaged_gguf(m, cache, gguf, progress=True)
            print(f"{m.name}: ready at {path}")
        else:
            print(f"{m.name}: {src.kind} source {src.value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("prepare", "check"):
        p = sub.add_parser(name)
        p.add_argument("config", nargs="?", default="serve_config.yaml", type=Path)
    st = sub.add_parser("status", help="live per-model view from the Router and Ray's metrics")
    st.add_argument("--url", default="http://127.0.0.1:8000", help="the app's HTTP address")
    st.add_argument("--metrics-url", action="append", dest="metrics_urls",
                    help="Ray's Prometheus export, one per node (repeatable; "
                    "default http://127.0.0.1:8080/metrics)")  # fmt: skip
    st.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    st.add_argument("--once", action="store_true",
                    help="print one table (two scrapes an interval apart) and exit")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "status":
        from serve_app import status

        if args.interval <= 0:
            parser.error("--interval must be positive")
        urls = args.metrics_urls or ["http://127.0.0.1:8080/metrics"]
        return status.run(args.url, urls, args.interval, args.once)
    try:
        configs = app_configs(args.config)
        for config in configs:
            if args.command == "prepare":
                _prepare(config)
            else:
                for m in config.models:
                    model_source.check(m, config.cache_dir())
                    print(f"{m.name}: ok ({m.source})")
    except (ValidationError, model_source.ModelSourceError, OSError, yaml.YAMLError) as e:
        print(f"llmserve {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
