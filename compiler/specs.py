"""Kernel specialisations: the one place that maps a specialisation to its kernel name.

A specialisation is a frozen dataclass.  It yields the kernel (module) name,
the names of the functions the module exports, the Jinja template that
renders it and the template parameters.  Every specialisation parameter is part
of the kernel name, so two specialisations never share a symbol.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator, Union

import ml_dtypes
import numpy as np

from .targets import cpu_gathers, cpu_isa

__all__ = [
    "DTypeInfo", "DTYPES", "KernelSpec", "GridSamplerSpec", "UpsampleSpec", "GridSampler2dSpec",
    "UpsampleBilinear2dSpec", "Spec",
    "INTERPOLATION_MODES", "PADDING_MODES", "LAYOUTS", "all_specs", "dtype_info",
]

INTERPOLATION_MODES = ("bilinear", "nearest", "bicubic")  # aclnn/PyTorch codes 0, 1, 2
PADDING_MODES = ("zeros", "border", "reflection")  # aclnn/PyTorch codes 0, 1, 2
LAYOUTS = ("NCHW", "NHWC")
# Planes of dx one grid-sampler workgroup owns: each output point's coordinates are
# computed once for this many channels.
GRID_DX_CHANNEL_BLOCK = 8
# Lanes of the NHWC upsample kernel's loads and FMAs along C (masked at the tail).
UPSAMPLE_VECTOR_WIDTH = 8
# Stack buffer of the CPU upsample kernels' H-pass sums: NCHW's row (W_out values; longer
# rows take a slower path), NHWC's tile of W_out columns x one channel chunk.
UPSAMPLE_ROW_BYTES = 16384
# Elements per workgroup chunk of the CPU same-size pass (`<kernel>_same_size`: both axes
# kept, an elementwise copy): 64-256 KiB, so that a 2-worker device splits even small calls.
UPSAMPLE_SAME_CHUNK = 16384
# grad_grid alone on CPUs: the point-parallel pass (dgrid_points: a point per vector lane, the
# channels walked in order, no workspace) up to this many channels; above, the module's
# @grid_runs picks it at run time for a smooth grid (vector loads of consecutive taps) and
# the slot pass (a channel per lane: it pays off on scattered taps once its lanes are full)
# otherwise.  Both give the same bits.  Measured (2 x C x 250 x 370, 2 threads, random grid):
# C = 1: 2.1 vs 7.1 ms, 8: 6.1 vs 10.9 ms, 16: 23 vs 17 ms (README "Kernel formulations").
DGRID_POINTS_MAX_CHANNELS = 8
# Both gradients on CPUs: one block pass with a dx-only slot that also computes grad_grid
# point-parallel from the same coordinates (`<kernel>_points`: the same bits) from 3 up to
# this many channels, where the fused pass's grid-gradient taps of a slot of few channels
# cost more than the gathers (README "Kernel formulations").
SPLIT_POINTS_CHANNELS = range(3, 7)
# Invocations per workgroup of the GPU forms (a multiple of every subgroup size seen:
# lavapipe's 8, NVIDIA's 32, AMD's 64).
GPU_WORKGROUP_SIZE = 64
# Output points one invocation of the deterministic GPU dx walks (each chunk adds into
# its own copy of dx, so the workspace is ceil(H_out*W_out / this) copies of dx).
GPU_POINT_CHUNK = 16384
# Channels one invocation of the GPU dgrid sums before the ordered block reduction.
GPU_CHANNEL_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class DTypeInfo:
    """How one storage dtype is computed (SPEC part A, decision 4).

    `storage` is the MLIR element type of the tensors, `compute` the type of
    all arithmetic (f32 for f16/bf16), `accum` the element type dx is
    accumulated in by the scatter dispatch.
    """

    name: str
    short: str
    numpy: np.dtype
    storage: str
    compute: str
    accum: str
    compute_inf_hex: str


DTYPES = {
    "float32": DTypeInfo("float32", "f32", np.dtype(np.float32), "f32", "f32", "f32", "7F800000"),
    "float16": DTypeInfo("float16", "f16", np.dtype(np.float16), "f16", "f32", "f32", "7F800000"),
    "bfloat16": DTypeInfo("bfloat16", "bf16", np.dtype(ml_dtypes.bfloat16), "bf16", "f32", "f32", "7F800000"),
    "float64": DTypeInfo("float64", "f64", np.dtype(np.float64), "f64", "f64", "f64", "7FF0000000000000"),
}


def dtype_info(dtype) -> DTypeInfo:
    """Looks up a dtype given as a name ("float32") or anything `np.dtype` accepts.

    Raises KeyError (listing the supported dtypes) for any other dtype.
    """
    name = dtype if isinstance(dtype, str) and dtype in DTYPES else np.dtype(dtype).name
    try:
        return DTYPES[name]
    except KeyError:
        raise KeyError(f"dtype {name} is not supported; supported: {', '.join(DTYPES)}") from None


class KernelSpec:
    """What every specialisation shares; each operator's frozen dataclass below adds its own
    fields (at least `align_corners` and `dtype`), the class attributes `op` (its name in
    kernel names: the operator's name in the registry, aclnn_iree/ops/registry.py) and
    `template` (its template family's root, `<family>/module.mlir.j2`), and the classmethod
    `enumerate(dtypes)` (every specialisation, for all_specs)."""

    # {field: the values it may take}, each operator's own; checked on construction
    choices: dict = {}

    def __post_init__(self):
        """Raises ValueError for a field outside its choices, KeyError for an unknown dtype."""
        for field, allowed in self.choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} {getattr(self, field)!r} not in {allowed}")
        dtype_info(self.dtype)

    def _name(self, *parts) -> str:
        """`<op>_<parts>_ac0|ac1_<dtype>`: every specialisation parameter is in the name."""
        ac = "ac1" if self.align_corners else "ac0"
        return "_".join((self.op, *parts, ac, DTYPES[self.dtype].short))

    def _common_params(self, target) -> dict:
        """Template parameters every family takes (target None: a CPU target)."""
        d = DTYPES[self.dtype]
        return dict(kernel_name=self.kernel_name, align_corners=self.align_corners, storage_type=d.storage,
                    compute_type=d.compute, gpu=target is not None and target.is_gpu,
                    cpu_isa=None if target is not None and target.is_gpu else cpu_isa(),
                    gpu_workgroup=GPU_WORKGROUP_SIZE)


@dataclasses.dataclass(frozen=True)
class GridSamplerSpec(KernelSpec):
    """One specialisation of grid_sampler_2d_backward.

    The module exports a function per outputMask that computes something: `<kernel>`
    (dx and dgrid), `<kernel>_dx` and `<kernel>_dgrid`; CPU modules of the modes with a
    grid gradient also `<kernel>_dgrid_points` and `<kernel>_points`, other passes to the
    same bits (see function_name); GPU modules `..._deterministic` forms.
    """

    interpolation_mode: str
    padding_mode: str
    align_corners: bool
    dtype: str = "float32"

    op = "grid_sampler_2d_backward"
    template = "grid_sampler_2d_backward/module.mlir.j2"
    choices = {"interpolation_mode": INTERPOLATION_MODES, "padding_mode": PADDING_MODES}

    @property
    def kernel_name(self) -> str:
        return self._name(self.interpolation_mode, self.padding_mode)

    def function_name(self, output_mask=(True, True), deterministic: bool = False, target=None,
                      channels=None) -> str:
        """The exported function computing the outputs selected by `output_mask`.

        CPU modules are always deterministic.  GPU modules (`target.is_gpu`) export
        the dx-computing functions twice: the default (float atomics where the target
        has them) and `..._deterministic` (a fixed summation order), picked by
        `deterministic`.  dgrid alone is deterministic everywhere; on CPUs with at most
        DGRID_POINTS_MAX_CHANNELS `channels` it is `..._dgrid_points` (the same bits,
        no workspace), and both outputs with SPLIT_POINTS_CHANNELS `channels` are
        `<kernel>_points` (one pass: dx through a dx-only slot, grad_grid point-parallel
        from the same coordinates; the same bits).
        """
        mask = tuple(map(bool, output_mask))
        suffix = {(True, True): "", (True, False): "_dx", (False, True): "_dgrid"}[mask]
        gpu = target is not None and target.is_gpu
        if deterministic and mask[0] and gpu:
            suffix += "_deterministic"
        if not gpu and self.interpolation_mode != "nearest" and channels is not None and (
                (mask == (False, True) and channels <= DGRID_POINTS_MAX_CHANNELS)
                or (mask == (True, True) and channels in SPLIT_POINTS_CHANNELS)):
            suffix += "_points"
        return self.kernel_name + suffix

    def function_names(self, target=None) -> tuple:
        """Every function the module for `target` (default: a CPU target) exports."""
        names = (self.kernel_name, self.kernel_name + "_dx", self.kernel_name + "_dgrid")
        if target is not None and target.is_gpu:
            names += (self.kernel_name + "_deterministic", self.kernel_name + "_dx_deterministic")
        elif self.interpolation_mode != "nearest":
            names += (self.kernel_name + "_dgrid_points", self.kernel_name + "_points")
        return names

    @classmethod
    def enumerate(cls, dtypes) -> Iterator["GridSamplerSpec"]:
        """Every specialisation of the operator in `dtypes`."""
        for m, p, ac, dt in itertools.product(INTERPOLATION_MODES, PADDING_MODES, (False, True), dtypes):
            yield cls(m, p, ac, dt)

    def template_params(self, target=None) -> dict:
        """The template's parameters for `target` (default: a CPU target)."""
        d = DTYPES[self.dtype]
        params = self._common_params(target)
        params.update(mode=self.interpolation_mode, padding=self.padding_mode, accum_type=d.accum,
                      ct_inf_hex=d.compute_inf_hex, channel_block=GRID_DX_CHANNEL_BLOCK,
                      gpu_point_chunk=GPU_POINT_CHUNK, atomic_dx=params["gpu"] and d.accum in target.float_atomics)
        if not self.align_corners:  # only (g + 1) * size - 1 takes an fma
            params["fused_fma"] = target is None or target.fused_fma
        if self.interpolation_mode != "nearest":  # nearest has no grid gradient to compute
            params["gpu_channel_block"] = GPU_CHANNEL_BLOCK
        return params


@dataclasses.dataclass(frozen=True)
class UpsampleSpec(KernelSpec):
    """One specialisation of upsample_bilinear2d_backward (aclnn V2).

    The module exports one function, `<kernel>`.
    """

    align_corners: bool
    dtype: str = "float32"
    layout: str = "NCHW"

    op = "upsample_bilinear2d_backward"
    template = "upsample_bilinear2d_backward/module.mlir.j2"
    choices = {"layout": LAYOUTS}

    @property
    def kernel_name(self) -> str:
        return self._name(self.layout.lower())

    def function_name(self, same_size: bool = False) -> str:
        """The exported function for a call (a gather: deterministic on every target):
        `<kernel>_same_size` where neither axis is resized (`same_size`: H == H_out and
        W == W_out, where PyTorch maps each axis onto itself: one elementwise pass, the same
        bits), else the window passes."""
        return self.kernel_name + ("_same_size" if same_size else "")

    def function_names(self, target=None) -> tuple:
        return (self.kernel_name, self.kernel_name + "_same_size")

    @classmethod
    def enumerate(cls, dtypes) -> Iterator["UpsampleSpec"]:
        """Every specialisation of the operator in `dtypes`."""
        for ac, dt, lay in itertools.product((False, True), dtypes, LAYOUTS):
            yield cls(ac, dt, lay)

    def template_params(self, target=None) -> dict:
        """The template's parameters for `target` (default: a CPU target)."""
        params = self._common_params(target)
        params.update(layout=self.layout, vector_width=UPSAMPLE_VECTOR_WIDTH, same_chunk=UPSAMPLE_SAME_CHUNK,
                      row_cap=UPSAMPLE_ROW_BYTES // (8 if DTYPES[self.dtype].compute == "f64" else 4))
        return params


@dataclasses.dataclass(frozen=True)
class GridSampler2dSpec(GridSamplerSpec):
    """One specialisation of grid_sampler_2d (the forward, aclnnGridSampler2D): the module
    exports one function, `<kernel>` (input, grid -> output), and takes the grid sampler's
    template parameters (the coordinate macros are shared)."""

    op = "grid_sampler_2d"
    template = "grid_sampler_2d/module.mlir.j2"

    def function_name(self) -> str:
        return self.kernel_name

    def template_params(self, target=None) -> dict:
        """The backward's parameters, and on CPUs `cpu_gather`: whether the CPU's own gather
        instructions may load the taps (targets.cpu_gathers)."""
        params = super().template_params(target)
        if not params["gpu"]:
            params["cpu_gather"] = cpu_gathers(target)
        return params

    def function_names(self, target=None) -> tuple:
        return (self.kernel_name,)


@dataclasses.dataclass(frozen=True)
class UpsampleBilinear2dSpec(UpsampleSpec):
    """One specialisation of upsample_bilinear2d (the forward, aclnnUpsampleBilinear2d): the
    module exports one function, `<kernel>` (input, scales -> output)."""

    op = "upsample_bilinear2d"
    template = "upsample_bilinear2d/module.mlir.j2"

    def function_name(self) -> str:
        return self.kernel_name

    def function_names(self, target=None) -> tuple:
        return (self.kernel_name,)


Spec = Union[GridSamplerSpec, UpsampleSpec, GridSampler2dSpec, UpsampleBilinear2dSpec]


def all_specs(ops=None, dtypes=None) -> Iterator[Spec]:
    """Every specialisation that exists, optionally filtered by operator and dtype names: each
    operator of the registry (aclnn_iree.ops.registry) in its order, its spec class's
    `enumerate(dtypes)`.  Raises KeyError for an unknown operator or dtype."""
    from ..ops.registry import OPERATORS, get
    dtypes = tuple(dtypes or DTYPES)
    for dt in dtypes:
        dtype_info(dt)
    wanted = {get(name).name for name in ops} if ops else None
    for op in OPERATORS:
        if wanted is None or op.name in wanted:
            yield from op.spec.enumerate(dtypes)
