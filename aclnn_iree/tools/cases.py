"""The benchmark's case type, shared by every operator's benchmark module (bench_<op>.py)."""
from __future__ import annotations

import dataclasses

__all__ = ["Case"]


@dataclasses.dataclass(frozen=True)
class Case:
    """A benchmark case of the operator `op` (its registry name): `shape` is (N, C, H_in, W_in,
    H_out, W_out) (the grid sampler's grid is N x H_out x W_out x 2; the upsample's forward maps
    H_in x W_in to H_out x W_out); mode, padding: the operator's integer codes; `large`: one of
    the cases the thread-scaling measurement runs."""

    name: str
    op: str
    shape: tuple
    mode: int = 0
    padding: int = 0
    align_corners: bool = False
    layout: str = "NCHW"
    large: bool = False
