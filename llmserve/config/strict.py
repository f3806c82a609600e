"""What every config block shares: unknown fields are errors, values are frozen."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def checked_model_name(kind: str, v: str) -> str:
    """A name clients send as `model` (a model's or an adapter's), or ValueError."""
    if not MODEL_NAME_RE.fullmatch(v):  # match() would let a trailing newline through
        raise ValueError(
            f"{kind} name {v!r} must be 1-128 characters of letters, digits, '.', '_', ':' or "
            "'-', starting with a letter or digit"
        )
    return v


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
