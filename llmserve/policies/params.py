"""The base of a policy's parameters: a frozen dataclass whose fields carry their bounds.

A bound is annotated_types metadata on the field (`Annotated[float, Ge(0)]`), the same object
pydantic reads when the config validates the block (llmserve/config/app_config.py uses these classes
as its field types), so a field's name, default and bound are written once, here in the policy.
Constructed directly (tests, the simulator, the Ray adapters), `check_bounds` enforces them.

Ray passes a policy's arguments as JSON (RequestRouterConfig.request_router_kwargs,
AutoscalingPolicy.policy_kwargs), so a parameter object crosses as `to_dict` and comes back
with `from_dict`.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from annotated_types import BaseMetadata, Ge, GroupedMetadata, Gt, Le, Lt

P = TypeVar("P", bound="Params")

# metadata class -> (its attribute, the test a value must pass, the word for the message)
_TESTS: dict[type, tuple[str, Callable[[Any, Any], bool], str]] = {
    Gt: ("gt", operator.gt, ">"),
    Ge: ("ge", operator.ge, ">="),
    Lt: ("lt", operator.lt, "<"),
    Le: ("le", operator.le, "<="),
}


class Params:
    """Mixed into a frozen dataclass of a policy's parameters. A subclass with a check across
    fields does it in `__post_init__` after `super().__post_init__()`."""

    def __post_init__(self) -> None:
        check_bounds(self)

    @classmethod
    def of(cls: type[P], source: Params) -> P:
        """The fields of `cls` from `source`: an instance of `cls` or of a config block that
        extends it with fields of its own (llmserve/config/app_config.py)."""
        return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[P], values: dict[str, Any]) -> P:
        return cls(**values)


def check_bounds(params: object) -> None:
    """Raise ValueError naming the first field outside its annotated bound; None passes (an
    optional field left unset)."""
    for name, bounds in _bounds_of(type(params)):
        value = getattr(params, name)
        if value is None:
            continue
        for bound in bounds:
            attr, test, word = _TESTS[type(bound)]
            limit = getattr(bound, attr)
            if not test(value, limit):
                raise ValueError(f"{name} must be {word} {limit}, not {value!r}")


@functools.cache
def _bounds_of(cls: type) -> tuple[tuple[str, tuple[BaseMetadata, ...]], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    found = []
    for f in dataclasses.fields(cls):
        bounds = tuple(_metadata(hints[f.name]))
        unknown = [b for b in bounds if type(b) not in _TESTS]
        if unknown:
            # pydantic would check it and a direct construction would not: refuse at once.
            raise TypeError(f"{cls.__name__}.{f.name}: no check here for {unknown}")
        if bounds:
            found.append((f.name, bounds))
    return tuple(found)


def _metadata(hint: Any):
    """The annotated_types bounds of a field's type, through `X | None`."""
    if typing.get_origin(hint) is typing.Annotated:
        for m in hint.__metadata__:
            if isinstance(m, GroupedMetadata):  # e.g. Interval(gt=0, le=1)
                yield from m
            elif isinstance(m, BaseMetadata):
                yield m
    elif typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            yield from _metadata(arg)
