"""One request's trail through the Router: metrics and one JSON access-log line when it ends.

The Router fills the trail as the request goes (tenant, model, queue wait, first token, replica)
and calls `finish` exactly once, however the request ends; `finish` is idempotent so that every
exit path may call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from llmserve.observability.metrics import RequestOutcome, RouterMetrics
from llmserve.protocol.openai_protocol import OpenAIError

# A child of Ray Serve's logger, so that the lines land in the replica's own log file.
access_log = logging.getLogger("ray.serve.llmserve.access")


@dataclass
class RequestTrail:
    metrics: RouterMetrics
    request_id: str
    trace_id: str
    kind: str
    start_s: float = field(default_factory=time.monotonic)
    tenant: str = "unknown"
    model: str = "unknown"
    priority: str = "unknown"
    stream: bool = False
    queue_wait_s: float | None = None
    edge_wait_s: float | None = None  # from HAProxy to the Router, where HAProxy stamped it
    ttft_objective_s: float | None = None  # the class's first-token promise
    first_s: float | None = None  # monotonic time the first token was in hand
    replica: str | None = None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    # First to last token, where the Router did not see them arrive (a reply sent whole).
    generation_s: float | None = None
    num_resumes: int = 0  # the stream resumed on another replica (llmserve/policies/resume.py)
    num_preemptions: int = 0  # it gave its slot to a more urgent request, then went on
    finished: bool = False

    @contextlib.contextmanager
    def finished_if_it_fails(self) -> Iterator[RequestTrail]:
        """Any exception out of the block finishes the trail with its outcome (then goes on);
        on success the block finishes the trail itself, or leaves it to the stream's end."""
        try:
            yield self
        except BaseException as e:
            self.finish(*outcome_of(e))
            raise

    def finish(self, outcome: str, code: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        end_s = time.monotonic()
        ttft_s = None if self.first_s is None else self.first_s - self.start_s
        tpot_s = None
        if self.first_s is not None and self.num_completion_tokens > 1:
            span_s = self.generation_s if self.generation_s is not None else end_s - self.first_s
            tpot_s = span_s / (self.num_completion_tokens - 1)
        done = RequestOutcome(
            model=self.model,
            tenant=self.tenant,
            priority=self.priority,
            outcome=outcome,
            code=code,
            e2e_s=end_s - self.start_s,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            queue_wait_s=self.queue_wait_s,
            edge_wait_s=self.edge_wait_s,
            num_prompt_tokens=self.num_prompt_tokens,
            num_completion_tokens=self.num_completion_tokens,
            ttft_objective_s=self.ttft_objective_s,
            num_resumes=self.num_resumes,
            num_preemptions=self.num_preemptions,
        )
        self.metrics.record(done)
        access_log.info(
            json.dumps(
                {
                    "request_id": self.request_id,
                    "trace_id": self.trace_id,
                    "kind": self.kind,
                    "model": self.model,
                    "tenant": self.tenant,
                    "priority": self.priority,
                    "stream": self.stream,
                    "status": outcome,
                    "code": code or None,
                    "ttft_ms": None if ttft_s is None else round(ttft_s * 1000, 1),
                    "ttft_objective": done.objective,
                    "e2e_ms": round((end_s - self.start_s) * 1000, 1),
                    "queue_wait_ms": None
                    if self.queue_wait_s is None
                    else round(self.queue_wait_s * 1000, 1),
                    "edge_wait_ms": None
                    if self.edge_wait_s is None
                    else round(self.edge_wait_s * 1000, 1),
                    "prompt_tokens": self.num_prompt_tokens,
                    "completion_tokens": self.num_completion_tokens,
                    "replica": self.replica,
                    "resumes": self.num_resumes,
                    "preemptions": self.num_preemptions,
                }
            )
        )


def outcome_of(e: BaseException) -> tuple[str, str]:
    """(outcome, code) of a request that ended with `e`, for metrics and the access log."""
    if isinstance(e, OpenAIError):
        return str(e.status), str(e.code or "")
    if isinstance(e, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled", ""
    return "500", ""
