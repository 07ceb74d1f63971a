"""Every operator, one line each (ops/__init__.py says what an Operator holds)."""
from __future__ import annotations

from . import grid_sampler, grid_sampler_forward, upsample, upsample_forward

__all__ = ["OPERATORS", "get"]

OPERATORS = (
    grid_sampler.OPERATOR,
    upsample.OPERATOR,
    grid_sampler_forward.OPERATOR,
    upsample_forward.OPERATOR,
)
_BY_NAME = {op.name: op for op in OPERATORS}


def get(name: str):
    """The Operator called `name` (e.g. "grid_sampler_2d_backward"); KeyError listing the
    operators for any other name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}; known: {', '.join(_BY_NAME)}") from None
