"""What every config block shares: unknown fields are errors, values are frozen."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
