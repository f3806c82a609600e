"""llmserve/policies/params.py: a policy's parameters check their annotated bounds when built
directly, cross Ray as plain dicts, and come out of a config block that extends them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import pytest
from annotated_types import Ge, Gt, Interval, Le, Lt, MultipleOf

from llmserve.policies.params import Params


@dataclass(frozen=True, kw_only=True)
class Knobs(Params):
    weight: Annotated[float, Ge(0)] = 1.0
    share: Annotated[float, Gt(0), Le(1)] = 0.5
    below_ten: Annotated[int, Lt(10)] = 0
    optional_s: Annotated[float, Gt(0)] | None = None
    band: Annotated[float, Interval(ge=1, lt=2)] = 1.0
    name: str = "x"


@dataclass(frozen=True, kw_only=True)
class KnobsBlock(Knobs):
    """A config block extending the knobs with one of its own."""

    period_s: Annotated[float, Gt(0)] = 1.0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({}, None),
        ({"weight": 0.0}, None),
        ({"weight": -0.1}, "weight must be >= 0, not -0.1"),
        ({"share": 0.0}, "share must be > 0"),
        ({"share": 1.0}, None),
        ({"share": 1.5}, "share must be <= 1"),
        ({"below_ten": 10}, "below_ten must be < 10"),
        ({"optional_s": None}, None),  # unset: nothing to check
        ({"optional_s": 0.0}, "optional_s must be > 0"),
        ({"band": 2.0}, "band must be < 2"),  # a grouped bound, checked part by part
        ({"band": 0.5}, "band must be >= 1"),
        ({"period_s": 0.0}, "period_s must be > 0"),  # the extension's own bounds too
    ],
)
def test_bounds_are_checked_on_construction(kwargs, error):
    if error is None:
        KnobsBlock(**kwargs)
        return
    with pytest.raises(ValueError, match=error):
        KnobsBlock(**kwargs)


def test_of_keeps_only_the_policys_fields():
    block = KnobsBlock(weight=2.0, period_s=5.0)
    knobs = Knobs.of(block)
    assert type(knobs) is Knobs and knobs == Knobs(weight=2.0)


def test_to_dict_is_json_and_from_dict_gives_it_back():
    knobs = Knobs(weight=2.0, optional_s=3.0, name="y")
    wire = json.loads(json.dumps(knobs.to_dict()))  # what Ray's kwargs validators demand
    assert Knobs.from_dict(wire) == knobs


def test_a_bound_this_cannot_check_is_refused():
    @dataclass(frozen=True)
    class Odd(Params):
        even: Annotated[int, MultipleOf(2)] = 2

    with pytest.raises(TypeError, match="no check here"):
        Odd()
