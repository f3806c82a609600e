"""The Router's admission: per-tenant rate and concurrency limits, then a per-model priority queue.

Acts on the pure policies (llmserve/policies/: rate_limit.py, admission.py) with asyncio futures
and the clock; holds no policy of its own. One gate per Router replica; limits and queue capacity
are this replica's share of the app's (see TenantLimiter and docs/admission.md).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable

from llmserve.config.app_config import AppConfig, ModelConfig, TenantConfig
from llmserve.observability import tracing
from llmserve.policies import readiness
from llmserve.policies.admission import AdmissionPolicy, Admit, Queue, Reject
from llmserve.policies.in_flight_limit import InFlightLimit
from llmserve.policies.rate_limit import TenantLimiter
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.router import refusals
from llmserve.router.ticket import Ticket

UNKNOWN_MODEL = "unknown"  # the metrics label of a refusal made before the body named a model
# A promised class's least queue wait, however slow the engine: a slot freeing within a tick.
MIN_PROMISE_WAIT_S = 0.1


def _initial_replicas(model: ModelConfig) -> int:
    a = model.deployment.autoscaling
    return model.deployment.num_replicas if a is None else max(a.min_replicas, 1)


class Gate:
    def __init__(
        self,
        config: AppConfig,
        tenants: list[TenantConfig],
        num_router_replicas: int,
        clock: Callable[[], float] = time.monotonic,
        wake: Callable[[str], None] = lambda model: None,
    ) -> None:
        self.clock = clock  # tickets' times are on it; the Router's relay and housekeeping read it
        self._wake = wake  # starts a replica of a model scaled to zero (the Router's handle call)
        self._cold_since: dict[str, float] = {}  # models with no replica, since a request came
        self._share = 1.0 / num_router_replicas
        self._levels = config.admission.priority_levels
        self._tenants = {t.name: t for t in tenants}
        self._limiters = {
            t.name: TenantLimiter(
                requests_per_s=t.rate_limits.requests_per_s,
                max_burst_requests=t.rate_limits.max_burst_requests,
                tokens_per_min=t.rate_limits.tokens_per_min,
                share=self._share,
            )
            for t in tenants
        }
        self._models = {m.name: m for m in config.models}
        adm = config.admission
        self._objective_s = {
            adm.priority_levels[c]: s for c, s in adm.ttft_objective_s_by_class.items()
        }
        self._max_wait_s = {  # as configured, for the levels with a promise
            level: adm.max_queue_wait_s_by_level().get(level, adm.max_queue_wait_s)
            for level in self._objective_s
        }
        self._queues = {
            m.name: AdmissionPolicy(
                capacity=self._capacity(m, _initial_replicas(m)),
                max_queue_len=adm.max_queue_len,
                max_queue_wait_s=adm.max_queue_wait_s,
                max_queue_wait_s_by_level=adm.max_queue_wait_s_by_level(),
                ageing_s=adm.ageing_s,
                capped_priority=max(adm.priority_levels.values()),
                batch_max_share=adm.batch_max_share,
                batch_prefill_share=adm.batch_prefill_share,
                batch_waits_for_first_tokens=adm.batch_waits_for_first_tokens,
                engine_slots=self._engine_slots(m, _initial_replicas(m)),
                ttft_objective_s_by_level=self._objective_s,
            )
            for m in config.models
        }
        # What the model's replicas may hold, and the part of it they serve within promises
        # (without a promise to keep or a first token to grow on, a limit would only stay put).
        self._caps = {m.name: self._queues[m.name].capacity for m in config.models}
        self._tightest_s = min(self._objective_s.values(), default=None)
        self._limits = {
            m.name: InFlightLimit(
                min_limit=adm.min_in_flight,
                max_limit=self._caps[m.name],
                start_limit=self._queues[m.name].engine_slots,
            )
            for m in config.models
            if adm.adaptive_in_flight and self._tightest_s is not None
        }
        for model in self._limits:
            self._follow_limit(model)
        self._live_replicas: dict[str, int] = {}  # unknown until the first refresh
        self._may_scale_to_zero = frozenset(
            m.name
            for m in config.models
            if m.deployment.autoscaling is not None and m.deployment.autoscaling.min_replicas == 0
        )
        self._waiters: dict[str, asyncio.Future] = {}
        self._preemptible: dict[str, Ticket] = {}  # by entry id, while in flight
        self._concurrent: Counter[str] = Counter()
        self._ids = itertools.count()
        self.num_rejected: Counter[tuple[str, str]] = Counter()  # (model, reason) -> count

    def _capacity(self, model: ModelConfig, num_replicas: int) -> int:
        # Every Router replica admits its share of what the model's replicas can run at once.
        if num_replicas == 0 and model.deployment.autoscaling is not None:
            # Scaled to zero: let one request through to Ray's handle, where the autoscaler
            # sees it and starts a replica; the rest wait in the queue (within their deadline).
            return 1
        return math.ceil(model.deployment.max_ongoing_requests * num_replicas * self._share)

    def _engine_slots(self, model: ModelConfig, num_replicas: int) -> int:
        # This Router replica's share of the engines' sequences (what batch_max_share divides).
        return math.ceil(model.engine.max_num_seqs * num_replicas * self._share)

    def priority(self, tenant: TenantConfig) -> int:
        return self._levels[tenant.priority]

    # ------------------------------------------------------------------------------ admission

    async def admit(
        self,
        tenant: TenantConfig,
        model: str,
        num_tokens: int,
        timeout_s: float,
        streamed: bool = False,
        waited_s: float = 0.0,
    ) -> Ticket:
        """Rate limit, concurrency cap, then queue; raises 429 / 503 / 504 OpenAIErrors.
        `streamed`: its first token will be seen (`first_token`), so it may move the limit.
        `waited_s`: what it waited before the Router, which its class's promise counts."""
        with tracing.tracer.start_as_current_span("rate_limit", record_exception=False) as span:
            span.set_attribute("llmserve.tenant", tenant.name)
            ticket = self._check_limits(tenant, model, num_tokens, timeout_s)
            ticket.edge_wait_s = waited_s
        with tracing.tracer.start_as_current_span("queue_wait", record_exception=False) as span:
            try:
                await self._enter_queue(ticket, self.priority(tenant), timeout_s)
            except BaseException:
                self._concurrent[tenant.name] -= 1
                self._limiters[tenant.name].settle(num_tokens, 0, self.clock())
                ticket.finished = True
                raise
            now = self.clock()
            ticket.queue_wait_s = now - ticket.admitted_at
            objective_s = self._objective_s.get(ticket.priority)
            if streamed and model in self._limits:
                self._limits[model].started(
                    ticket.entry_id,
                    ticket.priority,
                    ticket.admitted_at - ticket.edge_wait_s,
                    self._tightest_s if objective_s is None else objective_s,
                    now,
                    num_in_flight=self._queues[model].num_in_flight,
                    promised=objective_s is not None,
                )
            if not streamed:  # its first token is not seen: its prefill counts for a mean one
                self._queues[model].prefills.unseen_first_token(ticket.entry_id, now)
            span.set_attribute("llmserve.queue_wait_s", ticket.queue_wait_s)
        return ticket

    def precheck(self, tenant: TenantConfig) -> None:
        """The tenant's request rate, right after its key and before its body is read; raises
        the 429. Admission proper (`admit`) takes from the buckets."""
        decision = self._limiters[tenant.name].peek_request(self.clock())
        if not decision.allowed:
            self.num_rejected[(UNKNOWN_MODEL, "rate_limit")] += 1
            raise refusals.rate_limited(tenant, decision, decision.status.headers())

    def _check_limits(
        self, tenant: TenantConfig, model: str, num_tokens: int, timeout_s: float
    ) -> Ticket:
        """The tenant's token buckets and concurrency cap; a ticket holding both, or 429."""
        now = self.clock()
        limiter = self._limiters[tenant.name]
        decision = limiter.try_admit(num_tokens, now)
        headers = decision.status.headers()
        if not decision.allowed:
            self.num_rejected[(model, "rate_limit")] += 1
            if decision.exceeds_limit:
                raise refusals.too_large(num_tokens, headers)
            raise refusals.rate_limited(tenant, decision, headers)
        ticket = Ticket(
            f"q{next(self._ids)}",
            tenant.name,
            model,
            num_tokens,
            now + timeout_s,
            headers,
            admitted_at=now,
        )
        cap = tenant.max_concurrent_requests
        if cap is not None and self._concurrent[tenant.name] >= math.ceil(cap * self._share):
            limiter.settle(num_tokens, 0, now)
            self.num_rejected[(model, "concurrency")] += 1
            raise refusals.too_concurrent(tenant, cap, headers)
        self._concurrent[tenant.name] += 1
        return ticket

    async def _enter_queue(self, ticket: Ticket, priority: int, timeout_s: float) -> None:
        queue = self._queues[ticket.model]
        now = self.clock()
        ticket.priority = priority
        for r in queue.poll(now):  # expired entries must not count against the newcomer
            self._fail_waiter(ticket.model, r)
        self._refuse_a_late_start(ticket, priority)
        self._refuse_a_cold_start(ticket, priority, timeout_s)
        decision = queue.offer(ticket.entry_id, priority, now, ticket.edge_wait_s)
        if isinstance(decision, Admit):
            if decision.preempted is not None:
                self._preempt(decision.preempted)
            return
        if isinstance(decision, Reject):
            raise self._rejection(ticket.model, decision)
        assert isinstance(decision, Queue)
        if decision.displaced is not None:
            self._fail_waiter(ticket.model, decision.displaced)
        fut = asyncio.get_running_loop().create_future()
        self._waiters[ticket.entry_id] = fut
        try:
            await asyncio.wait_for(fut, timeout_s)
        except BaseException as e:
            # Timed out, cancelled (client left) or rejected: whichever, leave no trace behind.
            if not queue.cancel(ticket.entry_id) and queue.is_in_flight(ticket.entry_id):
                self._start(queue.release(ticket.entry_id, self.clock()))
            if isinstance(e, asyncio.TimeoutError):
                self.num_rejected[(ticket.model, "deadline")] += 1
                message = f"deadline of {timeout_s:g} s exceeded while queued"
                raise refusals.deadline_exceeded(message) from None
            raise
        finally:
            self._waiters.pop(ticket.entry_id, None)

    def _refuse_a_late_start(self, ticket: Ticket, priority: int) -> None:
        """Refuses now (503) a request whose class promise the line to a first token already
        breaks: admitted, it would only lengthen the line and miss."""
        objective_s, limit = self._objective_s.get(priority), self._limits.get(ticket.model)
        queued = self._queues[ticket.model].num_queued_by_level()
        expected_s = None if limit is None else limit.expected_first_s(priority, queued)
        if objective_s is not None and expected_s is not None and expected_s > objective_s:
            retry_s = max(1.0, expected_s - objective_s)
            raise self._rejection(ticket.model, Reject(ticket.entry_id, "queue_wait", retry_s))

    def _refuse_a_cold_start(self, ticket: Ticket, priority: int, timeout_s: float) -> None:
        """With no replica running (scaled to zero), a request waits for one to start: held if
        what is left of the start fits its class's promise (without one, its deadline), refused
        now if not (503 `cold_start`, Retry-After: the start left), the start begun regardless."""
        # Only a model that may scale to zero: elsewhere a count of none is a replica starting
        # anyway, or the Router's count from before the first one was up.
        model = ticket.model
        if model not in self._may_scale_to_zero or self._live_replicas.get(model) != 0:
            return
        autoscaling = self._models[model].deployment.autoscaling
        since_s = self._cold_since.setdefault(ticket.model, self.clock())
        left_s = max(0.0, autoscaling.replica_start_s - (self.clock() - since_s))
        if left_s <= self._objective_s.get(priority, timeout_s):
            return
        self._wake(ticket.model)
        raise self._rejection(ticket.model, Reject(ticket.entry_id, "cold_start", left_s))

    def preemptible(self, ticket: Ticket, on_preempt: Callable[[], None]) -> None:
        """`ticket`'s request may stop for a more urgent one and resume later: `on_preempt`
        stops it (the relay then awaits `ticket.readmitted`)."""
        if ticket.finished:
            return
        ticket.on_preempt, ticket.readmitted = on_preempt, None
        self._preemptible[ticket.entry_id] = ticket
        self._queues[ticket.model].mark_preemptible(ticket.entry_id, ticket.priority)

    def _preempt(self, entry_id: str) -> None:
        ticket = self._preemptible.pop(entry_id)
        ticket.readmitted = asyncio.get_running_loop().create_future()
        self._waiters[entry_id] = ticket.readmitted
        assert ticket.on_preempt is not None
        ticket.on_preempt()

    async def readmitted(self, ticket: Ticket) -> None:
        """Until a preempted request has its slot back; raises 503 (it waited longer than its
        class may) or 504 (its deadline passed meanwhile)."""
        assert ticket.readmitted is not None
        try:
            await asyncio.wait_for(ticket.readmitted, max(0.0, ticket.deadline_s - self.clock()))
            # Its resumed stream's first token goes unseen here: a prefill of the mean length.
            self._queues[ticket.model].prefills.unseen_first_token(ticket.entry_id, self.clock())
        except asyncio.TimeoutError:
            self.num_rejected[(ticket.model, "deadline")] += 1
            message = "the request's deadline passed while it was preempted"
            raise refusals.deadline_exceeded(message) from None
        finally:
            self._waiters.pop(ticket.entry_id, None)
            ticket.readmitted = None

    def _rejection(self, model: str, r: Reject) -> OpenAIError:
        self.num_rejected[(model, r.reason)] += 1
        return refusals.overloaded(model, r.reason, r.retry_after_s)

    def _fail_waiter(self, model: str, r: Reject) -> None:
        fut = self._waiters.get(r.entry_id)
        if fut is not None and not fut.done():
            fut.set_exception(self._rejection(model, r))

    def _start(self, entry_ids: list[str]) -> None:
        for entry_id in entry_ids:
            fut = self._waiters.get(entry_id)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def first_token(self, ticket: Ticket, at_s: float) -> None:
        """`ticket`'s first token was in hand at `at_s` (the gate's clock): its class's promise
        kept or missed moves the model's in-flight limit."""
        queue = self._queues[ticket.model]
        queue.prefills.first_token(ticket.entry_id, at_s)
        self._start(queue.start_due(at_s))
        limit = self._limits.get(ticket.model)
        if limit is not None:
            limit.first_token(ticket.entry_id, at_s)
            self._follow_limit(ticket.model)

    def _follow_limit(self, model: str) -> None:
        queue, limit = self._queues[model], self._limits.get(model)
        if limit is not None and limit.engine_s is not None:
            # What a promise leaves for the queue once the engine has taken its part: a request
            # that would wait longer is refused now, not started to miss.
            for level, objective_s in self._objective_s.items():
                left_s = min(self._max_wait_s[level], objective_s - limit.engine_s)
                queue.set_max_wait_s(level, max(MIN_PROMISE_WAIT_S, left_s))
        capacity = self._caps[model] if limit is None else min(self._caps[model], limit.limit)
        if capacity != queue.capacity:
            self._start(queue.set_capacity(capacity, self.clock(), queue.engine_slots))

    def finish(self, ticket: Ticket, num_used_tokens: int) -> None:
        """Give back the slot, the concurrency unit and the unused tokens. Idempotent."""
        if ticket.finished:
            return
        ticket.finished = True
        now = self.clock()
        self._concurrent[ticket.tenant] -= 1
        self._limiters[ticket.tenant].settle(ticket.num_reserved_tokens, num_used_tokens, now)
        self._preemptible.pop(ticket.entry_id, None)
        if ticket.model in self._limits:
            self._limits[ticket.model].forget(ticket.entry_id)
        queue = self._queues[ticket.model]
        if queue.cancel(ticket.entry_id):  # preempted, and ended while it waited to go on
            self._waiters.pop(ticket.entry_id, None)
            return
        self._start(queue.release(ticket.entry_id, now))

    # ------------------------------------------------------------------- periodic and state

    def tick(self) -> None:
        """Expire queued requests past their class's wait bound (call a few times a second)."""
        now = self.clock()
        for model, queue in self._queues.items():
            for r in queue.poll(now):
                self._fail_waiter(model, r)
            self._start(queue.start_due(now))
            if model in self._limits and self._limits[model].overdue(now):
                self._follow_limit(model)

    def set_live_replicas(self, model: str, num_replicas: int) -> None:
        self._live_replicas[model] = num_replicas
        if num_replicas:
            self._cold_since.pop(model, None)
        capacity = self._caps[model] = self._capacity(self._models[model], num_replicas)
        limit = self._limits.get(model)
        if limit is not None:
            limit.set_max(capacity)
            capacity = min(capacity, limit.limit)
        engine_slots = self._engine_slots(self._models[model], num_replicas)
        queue = self._queues[model]
        if (capacity, engine_slots) != (queue.capacity, queue.engine_slots):
            self._start(queue.set_capacity(capacity, self.clock(), engine_slots))

    def not_ready(self) -> dict[str, str]:
        """Models that cannot serve now, with why; empty when the app is ready for traffic."""
        return readiness.not_ready(self._models, self._live_replicas, self._may_scale_to_zero)

    def rate_headers(self, tenant: TenantConfig) -> dict[str, str]:
        return self._limiters[tenant.name].status(self.clock()).headers()

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {
            model: {"capacity": q.capacity, "in_flight": q.num_in_flight, "queued": q.num_queued}
            for model, q in self._queues.items()
        }
