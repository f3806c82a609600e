"""Router metrics, exported through Ray's metrics pipeline (one scrape per node, port 8080).

Ray prefixes application metrics with `ray_`, so `llmserve_queue_depth` is scraped as
`ray_llmserve_queue_depth`. The queue depth per model is what the autoscaler reads.
"""

from __future__ import annotations

from collections import Counter as _Counter

from ray.serve.metrics import Counter, Gauge


class RouterMetrics:
    def __init__(self) -> None:
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
            description="In-flight cap of this Router replica, per model.",
            tag_keys=("model",),
        )
        self.rejections = Counter(
            "llmserve_rejections",
            description="Requests refused at the door, by model and reason "
            "(rate_limit, concurrency, queue_full, queue_wait, queue_timeout, deadline).",
            tag_keys=("model", "reason"),
        )
        self._exported: _Counter[tuple[str, str]] = _Counter()

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
