"""The Router's half of the token path: a forwarded request's reply, relayed as it comes.

Bytes in, bytes out, per item (several tokens each): nothing is parsed per token. Settling a
reply gives its admission slot back and charges the tenant's token bucket with the usage the
replica counted, once, however the reply ended; a deadline that passed ends it with a 504. The
rules (retry before the first output, what a reply costs) are llmserve/policies/relay.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

from ray.serve.exceptions import RequestCancelledError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from llmserve.policies.relay import (
    MAX_ATTEMPTS,
    Attempt,
    Deadline,
    Next,
    after_attempt,
    deadline_action,
    head_wait_s,
    past_deadline,
    tokens_charged,
)
from llmserve.protocol.openai_protocol import OpenAIError
from llmserve.protocol.replica_call import ReplicaRequest, ReplyHead, split_part
from llmserve.router.admission_gate import Gate
from llmserve.router.request_log import outcome_of
from llmserve.router.request_path import DONE_FRAME, OpenReply, resumed_comment, sse_error
from llmserve.router.ticket import Ticket

logger = logging.getLogger("ray.serve")
UNAVAILABLE = "the model is unavailable; retry shortly"
ENGINE_FAILED = OpenAIError(
    503, "the model's engine failed during generation; retry", headers={"Retry-After": "1"}
)


class Preempted(Exception):
    """A tracked stream's slot went to a more urgent request: its engine request was aborted."""


def can_resume(r: OpenReply) -> bool:
    return r.resumable is not None and r.resumable.progress.can_resume()


class ReplyRelay:
    def __init__(self, gate: Gate) -> None:
        self.gate = gate  # its clock is the one tickets' deadlines are on
        # Dispatched and not yet finished, by entry id: whose deadlines `enforce_deadlines`
        # keeps (one timer for all instead of a timeout around every item).
        self.dispatched: dict[str, tuple[Ticket, DeploymentResponseGenerator]] = {}

    def enforce_deadlines(self) -> None:
        """Cancels what ran past its deadline (the engine aborts it, its reader answers 504),
        forgets what finished, and gives back the slot of what nobody reads any more."""
        now = self.gate.clock()
        for entry_id, (ticket, stream) in list(self.dispatched.items()):
            action = deadline_action(now, ticket.deadline_s, ticket.finished, ticket.expired)
            if action is Deadline.FORGET:
                del self.dispatched[entry_id]
            elif action is Deadline.EXPIRE:
                ticket.expired = True
                stream.cancel()
            elif action is Deadline.RECLAIM:
                logger.warning("reclaiming abandoned request %s", entry_id)
                self.gate.finish(ticket, ticket.num_reserved_tokens)
                del self.dispatched[entry_id]

    async def dispatch(
        self, handle: DeploymentHandle, request: ReplicaRequest, ticket: Ticket, session: str
    ) -> tuple[DeploymentResponseGenerator, ReplyHead]:
        """Sends to a replica and waits for its reply head. A replica that fails before any
        output (it died, or says it is unhealthy) costs one retry on another replica. A stream
        whose deadline passed before its head is a 504, not a 200 that ends in an error: the
        housekeeping tick that enforces deadlines may not have come round yet."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            options = {"stream": True, "session_id": session} if session else {"stream": True}
            stream: DeploymentResponseGenerator = handle.options(**options).generate.remote(request)
            self.dispatched[ticket.entry_id] = (ticket, stream)
            try:
                wait_s = head_wait_s(self.gate.clock(), ticket.deadline_s)
                head = await asyncio.wait_for(self.next(stream, ticket), wait_s)
            except TimeoutError:
                stream.cancel()
                logger.warning(
                    "request %s: no reply head %.1f s after its deadline",
                    request.request_id,
                    wait_s,
                )
                raise self._deadline_passed(ticket, "before its replica answered") from None
            except (OpenAIError, asyncio.CancelledError):
                stream.cancel()  # the caller left or the deadline passed
                raise
            except StopAsyncIteration:
                raise OpenAIError(500, "the replica ended the reply without a head") from None
            except Exception as e:
                stream.cancel()
                logger.warning(
                    "request %s failed before output on attempt %d: %r",
                    request.request_id,
                    attempt,
                    e,
                )
                verdict = after_attempt(attempt, Attempt.FAILED)
            else:
                if head.code != "replica_unhealthy":
                    now = self.gate.clock()
                    if head.is_stream and past_deadline(now, ticket.deadline_s, ticket.expired):
                        stream.cancel()
                        raise self._deadline_passed(ticket)
                    return stream, head
                stream.cancel()
                verdict = after_attempt(attempt, Attempt.UNHEALTHY, head.replica_id)
            if verdict.next is Next.GIVE_UP:
                raise OpenAIError(
                    503, UNAVAILABLE, code=verdict.code, headers={"Retry-After": "1"}
                ) from None
            if verdict.avoid_replica:
                request = dataclasses.replace(request, avoid_replica_id=verdict.avoid_replica)
        raise AssertionError("unreachable: the last attempt gives up")

    async def next(self, stream: DeploymentResponseGenerator, ticket: Ticket):
        """The reply's next item, or a 504 once the request's deadline has cancelled it, or
        Preempted once a more urgent request took its slot."""
        try:
            return await stream.__anext__()
        except RequestCancelledError:
            if ticket.expired:
                raise self._deadline_passed(ticket) from None
            if ticket.readmitted is not None:
                raise Preempted from None
            raise

    def allow_preemption(self, r: OpenReply) -> None:
        """A tracked stream that may still resume may give its slot to a more urgent request."""
        if r.resumable is not None and r.resumable.progress.can_resume():
            self.gate.preemptible(r.ticket, lambda: r.rest.cancel())

    def _deadline_passed(self, ticket: Ticket, when: str = "during generation") -> OpenAIError:
        self.gate.num_rejected[(ticket.model, "deadline")] += 1
        return OpenAIError(504, f"the request's deadline passed {when}", code="deadline_exceeded")

    async def parts(self, r: OpenReply) -> AsyncIterator[bytes]:
        """The reply's bytes as they come; raises OpenAIError if it fails midway. A tracked
        stream whose replica or engine dies resumes on another replica, in the same stream;
        one preempted for a more urgent request resumes once it has a slot again."""
        try:
            if r.head.body:
                yield r.head.body
            while True:
                preempted = False
                try:
                    item = await self.next(r.rest, r.ticket)
                except StopAsyncIteration:
                    raise OpenAIError(
                        503,
                        "the model replica ended the reply early; retry",
                        headers={"Retry-After": "1"},
                    ) from None
                except (OpenAIError, asyncio.CancelledError):
                    raise
                except Preempted:
                    # Its engine request was aborted; it goes on where it stopped once a slot
                    # is its again (on whichever replica the request router picks).
                    await self.gate.readmitted(r.ticket)
                    preempted = True
                except Exception as e:  # the replica or its engine died mid-reply
                    r.replica_failed = True
                    logger.warning("request %s failed during generation: %r", r.trail.request_id, e)
                    if not can_resume(r):
                        raise OpenAIError(
                            503,
                            "the model replica failed during generation; retry",
                            headers={"Retry-After": "1"},
                        ) from None
                else:
                    if type(item) is bytes:
                        if r.resumable is not None:
                            item, ids = split_part(item)
                            r.resumable.progress.add(ids)
                        yield item
                        continue
                    if item.token_ids:
                        r.resumable.progress.add(item.token_ids)
                    if item.body:
                        yield item.body
                    if not (item.failed and can_resume(r)):
                        r.end = item
                        return
                    r.replica_failed = True
                    logger.warning("request %s: its engine failed mid-stream", r.trail.request_id)
                head, num_sent = await self._resume(r, preempted)
                if r.resumable.announce:
                    yield resumed_comment(head.replica_id, num_sent, preempted)
                r.resumable.progress.add(head.token_ids)
                if head.body:
                    yield head.body
        finally:
            self.settle(r)

    async def _resume(self, r: OpenReply, preempted: bool) -> tuple[ReplyHead, int]:
        """The tracked stream `r` on a replica again, from where its client has it: another
        one after a failure, any after a preemption."""
        res = r.resumable
        assert res is not None
        r.rest.cancel()
        failed_replica = None if preempted else r.head.replica_id
        request = dataclasses.replace(
            res.request, resume=res.progress.resume(), avoid_replica_id=failed_replica
        )
        r.rest, head = await self.dispatch(res.handle, request, r.ticket, res.session)
        if preempted:
            r.trail.num_preemptions += 1
        else:
            r.trail.num_resumes += 1
        r.span.add_event(
            "preempted" if preempted else "resumed",
            {
                "llmserve.from_replica": r.head.replica_id,
                "llmserve.replica": head.replica_id,
                "llmserve.tokens_sent": len(request.resume.token_ids),
            },
        )
        logger.info(
            "request %s %s on replica %s after %d tokens",
            r.trail.request_id,
            "preempted, resumed" if preempted else "resumed",
            head.replica_id,
            len(request.resume.token_ids),
        )
        r.head = head
        self.allow_preemption(r)
        # Its token ids are the caller's, once it has sent its body on.
        return head, len(request.resume.token_ids)

    def settle(self, r: OpenReply) -> None:
        """Once per reply, however it ended: the slot back, the bucket charged, the trail filled."""
        self.dispatched.pop(r.ticket.entry_id, None)
        end = r.end
        if end is None:
            r.rest.cancel()  # aborts the engine request and frees its KV blocks
        else:
            u = end.usage
            r.trail.num_prompt_tokens = u.num_prompt_tokens
            r.trail.num_completion_tokens = u.num_completion_tokens
            if not r.head.is_stream and u.first_output_s is not None:
                r.trail.first_s = r.dispatched_s + u.first_output_s
                r.trail.generation_s = (u.last_output_s or u.first_output_s) - u.first_output_s
        used = None if end is None else end.usage.num_total_tokens
        self.gate.finish(
            r.ticket, tokens_charged(used, r.ticket.num_reserved_tokens, r.replica_failed)
        )
        r.span.set_attribute("llmserve.completion_tokens", r.trail.num_completion_tokens)
        r.span.set_attribute("llmserve.completed", end is not None and not end.failed)
        r.span.end()

    async def collect(self, r: OpenReply) -> bytes:
        return b"".join([part async for part in self.parts(r)])

    async def sse(self, r: OpenReply) -> AsyncIterator[bytes]:
        outcome: tuple[str, str] = ("cancelled", "")  # unless it gets further
        tail = b""
        try:
            async for part in self.parts(r):
                tail = (tail + part)[-len(DONE_FRAME) :]
                yield part
            outcome = ("ok", "")
            if r.end.failed:
                outcome = ("503", "engine_error")
                if tail != DONE_FRAME:  # the engine died without its own error chunk: ours
                    yield sse_error(ENGINE_FAILED)
        except OpenAIError as e:
            outcome = outcome_of(e)
            yield sse_error(e)
        except Exception:  # a bug of ours: still end the stream the way clients expect
            logger.exception("stream %s failed", r.trail.request_id)
            outcome = ("500", "")
            yield sse_error(OpenAIError(500, "internal server error"))
        finally:
            r.trail.finish(*outcome)
