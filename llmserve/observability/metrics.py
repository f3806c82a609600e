"""Router metrics, exported through Ray's metrics pipeline (one scrape per node, port 8080).

Ray prefixes application metrics with `ray_`: `llmserve_ttft_seconds` is scraped as
`ray_llmserve_ttft_seconds_bucket` etc. The engines' own metrics come from vLLM's Ray stat logger
(`ray_vllm_*`), not from here. The queue depth per model is what the autoscaler reads.
Labels stay bounded: `model` is a configured model or "unknown", `tenant` a configured tenant or
"unknown"; a client cannot mint new series.
"""

from __future__ import annotations

from collections import Counter as _Counter
from dataclasses import dataclass

from ray.serve.metrics import Counter, Gauge, Histogram

TTFT_BUCKETS_S = [0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]
TPOT_BUCKETS_S = [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56]
E2E_BUCKETS_S = [0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
QUEUE_BUCKETS_S = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64]
REQUEST_TAGS = ("model", "tenant", "priority")


@dataclass
class RequestOutcome:
    """What one request did, as the Router saw it; recorded once when it ends."""

    model: str
    tenant: str
    priority: str
    outcome: str  # "ok", "cancelled", or the HTTP status as text ("429", "503", ...)
    code: str  # the error code ("rate_limit_exceeded", "queue_full", ...) or ""
    e2e_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    queue_wait_s: float | None = None
    # From HAProxy to the Router (request_path.edge_wait_s); None where nothing stamped it.
    edge_wait_s: float | None = None
    ttft_objective_s: float | None = None  # the class's first-token promise, where it has one
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_resumes: int = 0  # times its stream resumed on another replica
    num_preemptions: int = 0  # times it gave its slot to a more urgent request

    @property
    def objective(self) -> str | None:
        """ "met" or "missed" for an admitted request of a class with a first-token promise
        (one that ended without a first token missed it, unless its client left first);
        None where there is nothing to judge: no promise, refused at admission, or cancelled
        by its client before its first token."""
        if self.ttft_objective_s is None:
            return None
        if self.ttft_s is not None:  # as its client waited: from the edge, where it is known
            waited_s = self.ttft_s + (self.edge_wait_s or 0.0)
            return "met" if waited_s <= self.ttft_objective_s else "missed"
        if self.queue_wait_s is None or self.outcome == "cancelled":
            return None
        return "missed"


class RouterMetrics:
    def __init__(self) -> None:
        def hist(name: str, desc: str, bounds: list[float]) -> Histogram:
            return Histogram(name, description=desc, boundaries=bounds, tag_keys=REQUEST_TAGS)

        self.ttft = hist(
            "llmserve_ttft_seconds", "Time to first token at the Router.", TTFT_BUCKETS_S
        )
        self.tpot = hist(
            "llmserve_tpot_seconds", "Time per output token after the first.", TPOT_BUCKETS_S
        )
        self.e2e = hist(
            "llmserve_e2e_seconds", "End-to-end request latency at the Router.", E2E_BUCKETS_S
        )
        self.queue_wait = hist(
            "llmserve_queue_wait_seconds",
            "Time admitted requests waited in the Router's queue.",
            QUEUE_BUCKETS_S,
        )
        self.edge_wait = hist(
            "llmserve_edge_wait_seconds",
            "Time from HAProxy to the Router (HAProxy, Serve's proxy, the hop, the Router's "
            "event loop), of the requests HAProxy stamped: their promise counts it.",
            QUEUE_BUCKETS_S,
        )
        self.requests = Counter(
            "llmserve_requests",
            description="Requests by outcome (ok, cancelled, or HTTP status) and error code.",
            tag_keys=(*REQUEST_TAGS, "outcome", "code"),
        )
        self.ttft_objective = Counter(
            "llmserve_ttft_objective",
            description="Admitted requests of a class with a first-token promise "
            "(admission.ttft_objective_s_by_class), by whether their first token met it.",
            tag_keys=(*REQUEST_TAGS, "result"),
        )
        self.resumes = Counter(
            "llmserve_stream_resumes",
            description="Streams resumed on another replica after theirs or its engine died.",
            tag_keys=REQUEST_TAGS,
        )
        self.preemptions = Counter(
            "llmserve_preemptions",
            description="Streams that gave their slot to a more urgent class's request and "
            "went on later where they stopped.",
            tag_keys=REQUEST_TAGS,
        )
        self.prompt_tokens = Counter(
            "llmserve_prompt_tokens", description="Prompt tokens.", tag_keys=REQUEST_TAGS
        )
        self.generation_tokens = Counter(
            "llmserve_generation_tokens", description="Generated tokens.", tag_keys=REQUEST_TAGS
        )
        self.queue_depth = Gauge(
            "llmserve_queue_depth",
            description="Requests waiting in the Router's queue, per model (this replica).",
            tag_keys=("model",),
        )
        self.in_flight = Gauge(
            "llmserve_in_flight",
            description="Requests admitted and not finished, per model (this replica).",
            tag_keys=("model",),
        )
        self.capacity = Gauge(
            "llmserve_admission_capacity",
            description="In-flight cap of this Router replica, per model: the adaptive limit.",
            tag_keys=("model",),
        )
        self.rejections = Counter(
            "llmserve_rejections",
            description="Requests refused at admission, by model and reason "
            "(rate_limit, concurrency, queue_full, queue_wait, queue_timeout, cold_start, "
            "deadline).",
            tag_keys=("model", "reason"),
        )
        self._exported: _Counter[tuple[str, str]] = _Counter()

    def record(self, r: RequestOutcome) -> None:
        tags = {"model": r.model, "tenant": r.tenant, "priority": r.priority}
        self.requests.inc(1, tags={**tags, "outcome": r.outcome, "code": r.code})
        self.e2e.observe(r.e2e_s, tags=tags)
        if r.ttft_s is not None:
            self.ttft.observe(r.ttft_s, tags=tags)
        if r.tpot_s is not None:
            self.tpot.observe(r.tpot_s, tags=tags)
        if r.queue_wait_s is not None:
            self.queue_wait.observe(r.queue_wait_s, tags=tags)
        if r.edge_wait_s is not None:
            self.edge_wait.observe(r.edge_wait_s, tags=tags)
        if (objective := r.objective) is not None:
            self.ttft_objective.inc(1, tags={**tags, "result": objective})
        if r.num_resumes:
            self.resumes.inc(r.num_resumes, tags=tags)
        if r.num_preemptions:
            self.preemptions.inc(r.num_preemptions, tags=tags)
        if r.num_prompt_tokens:
            self.prompt_tokens.inc(r.num_prompt_tokens, tags=tags)
        if r.num_completion_tokens:
            self.generation_tokens.inc(r.num_completion_tokens, tags=tags)

    def export(self, snapshot: dict[str, dict[str, int]], rejected: _Counter) -> None:
        for model, s in snapshot.items():
            tags = {"model": model}
            self.queue_depth.set(s["queued"], tags=tags)
            self.in_flight.set(s["in_flight"], tags=tags)
            self.capacity.set(s["capacity"], tags=tags)
        for (model, reason), n in rejected.items():
            delta = n - self._exported[(model, reason)]
            if delta:
                self.rejections.inc(delta, tags={"model": model, "reason": reason})
                self._exported[(model, reason)] = n


class ReplicaGpuMetrics:
    """GPU use of one LLMServer replica; never set where there is no GPU (absent, not zero)."""

    def __init__(self, model: str) -> None:
        tags = ("model", "gpu")
        self._model = model
        self.utilization = Gauge(
            "llmserve_gpu_utilization_percent",
            description="GPU utilisation (NVML), per replica and GPU.",
            tag_keys=tags,
        )
        self.memory_used = Gauge(
            "llmserve_gpu_memory_used_bytes",
            description="GPU memory in use (NVML), per replica and GPU.",
            tag_keys=tags,
        )

    def export(self, samples) -> None:
        for s in samples:
            tags = {"model": self._model, "gpu": str(s.index)}
            self.utilization.set(s.utilization_percent, tags=tags)
            self.memory_used.set(s.memory_used_bytes, tags=tags)


class ReplicaPrefixCacheMetrics:
    """The engine's own prefix-cache counts (vLLM's scheduler stats), per replica: vLLM's
    `ray_vllm_prefix_cache_*` carry the model, not the replica, and cache-aware routing is
    judged replica by replica."""

    def __init__(self, model: str) -> None:
        self._tags = {"model": model}
        self.queries = Counter(
            "llmserve_prefix_cache_queries",
            description="Prompt tokens the engine looked up in its prefix cache, per replica.",
            tag_keys=("model",),
        )
        self.hits = Counter(
            "llmserve_prefix_cache_hits",
            description="Prompt tokens the engine found in its prefix cache, per replica.",
            tag_keys=("model",),
        )
        self._last = (0, 0)

    def export(self, queries: int, hits: int) -> None:
        dq, dh = queries - self._last[0], hits - self._last[1]
        if dq > 0:
            self.queries.inc(dq, tags=self._tags)
        if dh > 0:
            self.hits.inc(dh, tags=self._tags)
        self._last = (queries, hits)


class ReplicaAdapterMetrics:
    """Which LoRA adapters one replica's engine holds, and how often that changed: an adapter
    seen held where it was not is a load (at start, or on demand for a request), one seen gone
    an eviction (vLLM's LRU, `max_cpu_loras`). Seen once per watchdog tick (a second): a load
    and its eviction between two looks count as neither."""

    def __init__(self, model: str) -> None:
        self._model = model
        tags = ("model", "adapter")
        self.loads = Counter(
            "llmserve_adapter_loads",
            description="LoRA adapters loaded into the replica's engine.",
            tag_keys=tags,
        )
        self.evictions = Counter(
            "llmserve_adapter_evictions",
            description="LoRA adapters the replica's engine let go (LRU, max_cpu_loras).",
            tag_keys=tags,
        )
        self.held = Gauge(
            "llmserve_adapter_held",
            description="1 while the replica's engine holds the LoRA adapter, else 0.",
            tag_keys=tags,
        )
        self._last: frozenset[str] = frozenset()

    def export(self, held: frozenset[str]) -> None:
        for adapter in held - self._last:
            tags = {"model": self._model, "adapter": adapter}
            self.loads.inc(1, tags=tags)
            self.held.set(1, tags=tags)
        for adapter in self._last - held:
            tags = {"model": self._model, "adapter": adapter}
            self.evictions.inc(1, tags=tags)
            self.held.set(0, tags=tags)
        self._last = held


def routing_decisions() -> Counter:
    """Replica choices by reason, counted by the request router
    (llmserve/request_router/request_router.py) in the Router's process."""
    return Counter(
        "llmserve_routing_decisions",
        description="Replica choices by reason: prefix (cache credit won), adapter (the "
        "engine holding the LoRA adapter won), load (cache or adapter known, load won), p2c, "
        "affinity, only.",
        tag_keys=("model", "reason"),
    )
