"""A local S3 for Ray Serve LLM's LoRA multiplexing: moto's server on a loopback port, one bucket,
the adapters' folders uploaded under one prefix.

Ray Serve LLM loads adapters only from a cloud URI (`lora_config.dynamic_lora_loading_path`:
s3://, gs://, abfss://, azure://), one subfolder per adapter, each in PEFT's layout. Its S3 client
is boto3 (and pyarrow for some listings), which both read the endpoint from the environment, so
the Ray processes are pointed here by `aws_env` and nothing leaves the host.

    with s3_standin(18790, {"bench-lora-1": Path(...)}) as store:
        store.uri  # s3://llmserve-bench/adapters, holding bench-lora-1/adapter_config.json ...
        store.env  # AWS_ENDPOINT_URL and dummy credentials, for the Ray cluster's processes
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

BUCKET, PREFIX = "llmserve-bench", "adapters"


@dataclass(frozen=True)
class S3StandIn:
    uri: str  # the adapters' parent folder: s3://BUCKET/PREFIX
    env: dict[str, str]


def aws_env(endpoint: str) -> dict[str, str]:
    """What boto3 (AWS_ENDPOINT_URL*) and pyarrow (AWS_ENDPOINT_URL_S3) need to use `endpoint`;
    moto accepts any credentials, but the clients refuse to sign without some."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }


def object_keys(folders: dict[str, Path], prefix: str = PREFIX) -> dict[str, Path]:
    """Each file of each adapter folder by its key: PREFIX/ADAPTER/relative/path (the layout
    Ray Serve LLM reads: one subfolder per adapter, named as clients name the adapter)."""
    return {
        f"{prefix}/{name}/{f.relative_to(folder).as_posix()}": f
        for name, folder in folders.items()
        for f in sorted(folder.rglob("*"))
        if f.is_file() and not f.name.startswith(".")
    }


@contextlib.contextmanager
def s3_standin(port: int, folders: dict[str, Path], log_path: Path) -> Iterator[S3StandIn]:
    """moto's server (a child process, stopped on the way out) holding `folders`."""
    endpoint = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_up(endpoint, proc)
        _upload(endpoint, folders)
        yield S3StandIn(f"s3://{BUCKET}/{PREFIX}", aws_env(endpoint))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _wait_up(endpoint: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(endpoint, timeout=2)
            return
        time.sleep(0.5)
    raise RuntimeError(f"moto server not up at {endpoint} after {timeout_s:.0f} s")


def _upload(endpoint: str, folders: dict[str, Path]) -> None:
    import boto3

    s3 = boto3.client("s3", **_client_kwargs(endpoint))
    s3.create_bucket(Bucket=BUCKET)
    for key, path in object_keys(folders).items():
        s3.upload_file(str(path), BUCKET, key)


def _client_kwargs(endpoint: str) -> dict[str, str]:
    env = aws_env(endpoint)
    return {
        "endpoint_url": endpoint,
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }
