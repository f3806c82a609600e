"""What one admitted request holds, from the gate (llmserve/router/admission_gate.py) through
dispatch and the reply's relay until `Gate.finish` gives it back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Ticket:
    """What one admitted request holds; `Gate.finish` gives it all back exactly once."""

    entry_id: str
    tenant: str
    model: str
    num_reserved_tokens: int
    deadline_s: float  # on the gate's monotonic clock
    rate_headers: dict[str, str]
    queue_wait_s: float = 0.0
    admitted_at: float = 0.0  # when it passed the rate limits, on the gate's clock
    edge_wait_s: float = 0.0  # what it waited before the Router: its promise counts it
    finished: bool = field(default=False)
    expired: bool = field(default=False)  # its deadline passed and its stream was cancelled
    priority: int = 0  # its class's level
    # A tracked stream that may give its slot to a more urgent request: what stops it.
    on_preempt: Callable[[], None] | None = field(default=None, repr=False)
    # Preempted: done when it may go on (its slot back), or failed (it waited too long).
    readmitted: asyncio.Future | None = field(default=None, repr=False)
