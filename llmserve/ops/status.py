"""`llmserve status`: a live text view of each model, read from Ray's Prometheus export.

Per model: healthy replicas (Ray Serve's `serve_deployment_replica_healthy`), the Router's queue
depth and in-flight requests (summed over Router replicas), TTFT p50/p99, the share of requests
whose class promises a first token (admission.ttft_objective_s_by_class) that got it in time,
and generated tokens/s. The promise share is over the same interval as TTFT.
TTFT comes from the Router's histogram: the bucket counts added since the previous refresh, or
all-time counts (marked `*`) when nothing finished in between. Tokens/s is the generation token
counter's increase over the measured time between two scrapes.

Everything but `run` is a pure function over exposition text or parsed numbers, unit-tested with
hand-made text. Several `--metrics-url`s (one per node) are summed.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from prometheus_client.parser import text_string_to_metric_families

# Names as scraped from Ray's export (Ray prefixes application metrics with `ray_`).
REPLICAS = "ray_serve_deployment_replica_healthy"
QUEUE_DEPTH = "ray_llmserve_queue_depth"
IN_FLIGHT = "ray_llmserve_in_flight"
CAPACITY = "ray_llmserve_admission_capacity"
TTFT_BUCKET = "ray_llmserve_ttft_seconds_bucket"
GENERATION_TOKENS = "ray_llmserve_generation_tokens_total"
TTFT_OBJECTIVE = "ray_llmserve_ttft_objective_total"
DEPLOYMENT_PREFIX = "llm-"


def deployment_of(model: str) -> str:
    """The Serve deployment name of a model (the same rule as llmserve.app.deployment_name)."""
    return DEPLOYMENT_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", model)


@dataclass
class ModelMetrics:
    """One model's numbers in one scrape, summed over label sets, replicas and nodes."""

    replicas: float | None = None
    queue_depth: float | None = None
    in_flight: float | None = None
    capacity: float | None = None
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    generation_tokens: float | None = None
    promise: dict[str, float] = field(default_factory=dict)  # result (met, missed) -> count


@dataclass
class Snapshot:
    time_s: float  # monotonic seconds when it was scraped
    models: dict[str, ModelMetrics]


@dataclass
class ModelRow:
    model: str
    replicas: float | None
    queue_depth: float | None
    in_flight: float | None
    capacity: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    ttft_all_time: bool  # True when the quantiles are over all requests, not the last interval
    tokens_per_s: float | None
    promise_kept: float | None = None  # share of promised first tokens in time, same interval


def _add(current: float | None, value: float) -> float:
    return value if current is None else current + value


def parse_models(texts: Iterable[str]) -> dict[str, ModelMetrics]:
    """Per-model numbers from Prometheus exposition texts (one per node).

    Models are those the Router labels (`model`), plus those with a `llm-<model>` deployment.
    The Router's "unknown" model (requests naming no configured model) is left out.
    """
    by_model: dict[str, ModelMetrics] = defaultdict(ModelMetrics)
    replicas_by_deployment: dict[str, float] = defaultdict(float)
    for text in texts:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                model = s.labels.get("model")
                if s.name == REPLICAS:
                    replicas_by_deployment[s.labels.get("deployment", "")] += s.value
                elif model is None or model == "unknown":
                    continue
                elif s.name == QUEUE_DEPTH:
                    by_model[model].queue_depth = _add(by_model[model].queue_depth, s.value)
                elif s.name == IN_FLIGHT:
                    by_model[model].in_flight = _add(by_model[model].in_flight, s.value)
                elif s.name == CAPACITY:
                    by_model[model].capacity = _add(by_model[model].capacity, s.value)
                elif s.name == GENERATION_TOKENS:
                    m = by_model[model]
                    m.generation_tokens = _add(m.generation_tokens, s.value)
                elif s.name == TTFT_OBJECTIVE and "result" in s.labels:
                    promise = by_model[model].promise
                    promise[s.labels["result"]] = promise.get(s.labels["result"], 0.0) + s.value
                elif s.name == TTFT_BUCKET and "le" in s.labels:
                    le = float(s.labels["le"])  # "+Inf" parses as inf
                    buckets = by_model[model].ttft_buckets
                    buckets[le] = buckets.get(le, 0.0) + s.value
    for deployment, n in replicas_by_deployment.items():
        known = [m for m in by_model if deployment_of(m) == deployment]
        if known:
            by_model[known[0]].replicas = n
        elif deployment.startswith(DEPLOYMENT_PREFIX):
            by_model[deployment[len(DEPLOYMENT_PREFIX) :]].replicas = n
    return dict(by_model)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts {le: count}.

    Linear interpolation inside the bucket that holds the rank; the first bucket starts at 0;
    a rank in the +Inf bucket gives the largest finite bound. None when there are no counts.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None  # not a complete histogram
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for i, le in enumerate(bounds):
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return bounds[-2] if len(bounds) > 1 else None
            if i == 0 and le <= 0:
                return le
            if count == prev_count:
                return le
            return prev_bound + (le - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = le, count
    return None


def bucket_delta(prev: dict[float, float], cur: dict[float, float]) -> dict[float, float] | None:
    """Counts added between two scrapes; None after a counter reset (a count went down)."""
    delta = {le: count - prev.get(le, 0.0) for le, count in cur.items()}
    if any(v < 0 for v in delta.values()):
        return None
    return delta


def counter_rate(prev: float | None, cur: float | None, elapsed_s: float) -> float | None:
    """Per-second increase of a counter; None without two values, or after a reset."""
    if cur is None or elapsed_s <= 0:
        return None
    increase = cur - (prev or 0.0)
    if increase < 0:
        return None
    return increase / elapsed_s


def model_rows(prev: Snapshot | None, cur: Snapshot) -> list[ModelRow]:
    """The table's rows: quantiles over the last interval where it had requests, else all-time."""
    rows = []
    for model in sorted(cur.models):
        m = cur.models[model]
        before = prev.models.get(model) if prev else None
        buckets, all_time, promise = m.ttft_buckets, True, m.promise
        if before is not None:
            delta = bucket_delta(before.ttft_buckets, m.ttft_buckets)
            if delta and max(delta.values(), default=0) > 0:
                buckets, all_time = delta, False
                promise = bucket_delta(before.promise, m.promise) or m.promise
        tokens_per_s = None
        if prev is not None:
            tokens_per_s = counter_rate(
                before.generation_tokens if before else None,
                m.generation_tokens,
                cur.time_s - prev.time_s,
            )
        rows.append(
            ModelRow(
                model=model,
                replicas=m.replicas,
                queue_depth=m.queue_depth,
                in_flight=m.in_flight,
                capacity=m.capacity,
                ttft_p50_s=histogram_quantile(0.5, buckets),
                ttft_p99_s=histogram_quantile(0.99, buckets),
                ttft_all_time=all_time,
                tokens_per_s=tokens_per_s,
                promise_kept=_share(promise.get("met", 0.0), sum(promise.values())),
            )
        )
    return rows


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if math.isfinite(v) and v == int(v) else f"{v:.1f}"


def _secs(v: float | None, all_time: bool) -> str:
    if v is None:
        return "-"
    text = f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
    return text + ("*" if all_time else "")


def render(rows: list[ModelRow], header: str, notes: Iterable[str] = ()) -> str:
    """The text of one refresh."""
    cols = (
        "model",
        "replicas",
        "queue",
        "in-flight",
        "TTFT p50",
        "TTFT p99",
        "promise kept",
        "tokens/s",
    )
    table = [cols]
    for r in rows:
        in_flight = _num(r.in_flight)
        if r.capacity is not None:
            in_flight += f"/{_num(r.capacity)}"
        tok = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.1f}"
        table.append(
            (
                r.model,
                _num(r.replicas),
                _num(r.queue_depth),
                in_flight,
                _secs(r.ttft_p50_s, r.ttft_all_time),
                _secs(r.ttft_p99_s, r.ttft_all_time),
                "-"
                if r.promise_kept is None
                else f"{r.promise_kept:.0%}" + ("*" if r.ttft_all_time else ""),
                tok,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = [header, ""]
    for row in table:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
    if not rows:
        lines.append("(no models in the metrics yet)")
    if any(r.ttft_all_time and r.ttft_p50_s is not None for r in rows):
        lines.append("* all requests so far (none finished in the last interval)")
    lines.extend(notes)
    return "\n".join(lines) + "\n"


def router_health(get: Callable[[str], dict], url: str) -> tuple[str, dict[str, dict]]:
    """('ok' or the error, {model: {capacity, in_flight, queued}}) from the Router's /healthz."""
    try:
        body = get(url.rstrip("/") + "/healthz")
        return str(body.get("status", "?")), dict(body.get("models") or {})
    except Exception as e:  # noqa: BLE001 - shown to the person, never raised
        return f"unreachable ({type(e).__name__})", {}


def scrape(get_text: Callable[[str], str], metrics_urls: list[str], now_s: float) -> Snapshot:
    return Snapshot(time_s=now_s, models=parse_models(get_text(u) for u in metrics_urls))


def with_router_models(snap: Snapshot, models: dict[str, dict]) -> Snapshot:
    """Adds models the Router knows but the metrics do not show yet (no traffic, no export)."""
    for name, s in models.items():
        m = snap.models.setdefault(name, ModelMetrics())
        if m.queue_depth is None:
            m.queue_depth = s.get("queued")
        if m.in_flight is None:
            m.in_flight = s.get("in_flight")
        if m.capacity is None:
            m.capacity = s.get("capacity")
    return snap


def run(
    url: str,
    metrics_urls: list[str],
    interval_s: float,
    once: bool,
    out=None,
    timeout_s: float = 5.0,
    api_key: str | None = None,
) -> int:
    """The live view; with `once`, two scrapes `interval_s` apart and one printed table.
    `timeout_s` bounds each HTTP call (the Router's /healthz, each metrics export); `api_key`
    makes /healthz name the models (without one it gives counts only)."""
    import httpx

    out = out or sys.stdout
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(timeout=timeout_s, headers=headers)

    def get_text(u: str) -> str:
        r = client.get(u)
        r.raise_for_status()
        return r.text

    def get_json(u: str) -> dict:
        r = client.get(u)
        r.raise_for_status()
        return r.json()

    def refresh() -> tuple[Snapshot | None, str]:
        try:
            return scrape(get_text, metrics_urls, time.monotonic()), ""
        except Exception as e:  # noqa: BLE001 - the view keeps going; the error is shown
            return None, f"metrics: {', '.join(metrics_urls)} unreachable ({e})"

    clear = "\x1b[H\x1b[2J" if (out.isatty() and not once) else ""
    prev, _ = refresh()
    try:
        while True:
            time.sleep(interval_s)
            cur, error = refresh()
            health, models = router_health(get_json, url)
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            header = f"llmserve status  {stamp}  router {url}: {health}  every {interval_s:g} s"
            if cur is None:
                out.write(clear + render([], header, [error]))
            else:
                cur = with_router_models(cur, models)
                out.write(clear + render(model_rows(prev, cur), header))
                prev = cur
            out.flush()
            if once:
                return 0 if cur is not None else 1
    except KeyboardInterrupt:
        return 0
    finally:
        client.close()
