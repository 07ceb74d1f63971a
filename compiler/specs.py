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
    "INTERPOLATION_MODES", "PADDING_MODES", "LAYOUTS", "FORMS", "all_specs", "dtype_info",
]

INTERPOLATION_MODES = ("bilinear", "nearest", "bicubic")  # aclnn/PyTorch codes 0, 1, 2
PADDING_MODES = ("zeros", "border", "reflection")  # aclnn/PyTorch codes 0, 1, 2
LAYOUTS = ("NCHW", "NHWC")
# The forms of a kernel (docs/kernel-design.md#forms): "tuned", the hand-written dispatches
# (templates/<family>/module.mlir.j2) for the targets they were written for; "linalg", the
# operator stated in linalg on tensors (templates/<family>/linalg.mlir.j2), which IREE's own
# code generation compiles for any target.
FORMS = ("tuned", "linalg")
# Suffixes of the functions only the tuned forms export (other passes to the same result).
_TUNED_PASSES = ("_points", "_same_size", "_deterministic")
# The linalg forms' extra iree-compile flags.  Buffers are 16-byte aligned (host arrays are
# imported without a copy: aclnn_iree.core.tensors HOST_ALIGNMENT): the dispatches IREE
# generates must assume no more, or its CPU code loads them with aligned vector loads (a
# segfault, seen in the f16 forms: IREE assumes 64 by default).  The tuned forms declare
# alignment(16) in their own dispatches.
_LINALG_FLAGS = ("--iree-stream-resource-min-offset-alignment=16",)
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
# C = 1: 2.1 vs 7.1 ms, 8: 6.1 vs 10.9 ms, 16: 23 vs 17 ms (docs/kernel-design.md).
DGRID_POINTS_MAX_CHANNELS = 8
# ... and, bilinear, for any channel count up to this many grad_output elements (N C H_out W_out):
# below it both passes' fixed costs outweigh the slot pass's gain (@grid_runs, the block pass
# and the partial sums against one pass, no workspace).  Measured, alternating in one
# process (Xeon, 2 vCPUs), slot pass (with @grid_runs) / point pass: 2 x 30 x 15 x 23 (the
# stereo demo's coarsest level) 55 / 26 us on one thread, smooth or random grid; 2 x 30 x 31
# x 46, 2 threads: 76 / 73 (smooth), 141 / 99 (random); 4 x 64 x 32 x 32: 222 / 228, 433 /
# 307; 2 x 30 x 62 x 92 (342 k): 312 / 293, 479 / 433; 2 x 30 x 88 x 130 (686 k): 508 / 517,
# 831 / 896; 2 x 30 x 125 x 185 random: 1.7 / 6.1 ms.  Bicubic's point pass lost on random
# grids from 2 x 16 x 32 x 32 (130 / 151 us): none there.
DGRID_POINTS_MAX_ELEMENTS = {"bilinear": 262144}


def dgrid_point_parallel(mode: str, channels: int, elements=None) -> bool:
    """Whether a CPU call of grad_grid alone takes the point-parallel pass (`..._dgrid_points`)
    rather than the slot pass: at most DGRID_POINTS_MAX_CHANNELS channels, or at most
    DGRID_POINTS_MAX_ELEMENTS[mode] grad_output elements (None: not known, the channels
    decide); never nearest (its grad_grid is 0)."""
    if mode == "nearest":
        return False
    most = DGRID_POINTS_MAX_ELEMENTS.get(mode)
    return channels <= DGRID_POINTS_MAX_CHANNELS or (most is not None and elements is not None and elements <= most)


# Both gradients on CPUs: one block pass with a dx-only slot that also computes grad_grid
# point-parallel from the same coordinates (`<kernel>_points`: the same bits) from 3 up to
# this many channels, where the fused pass's grid-gradient taps of a slot of few channels
# cost more than the gathers (docs/kernel-design.md).
SPLIT_POINTS_CHANNELS = range(3, 7)
# Invocations per workgroup of the GPU forms (a multiple of every subgroup size seen:
# lavapipe's 8, NVIDIA's 32, AMD's 64).
GPU_WORKGROUP_SIZE = 64
# Output points one invocation of the deterministic GPU dx walks (each chunk adds into
# its own copy of dx, so the workspace is ceil(H_out*W_out / this) copies of dx).
GPU_POINT_CHUNK = 16384
# Channels one invocation of the GPU dgrid sums before the ordered block reduction.
GPU_CHANNEL_BLOCK = 256
# The GPU targets whose calls of both gradients (atomic dx) take `<kernel>_points`, the
# CUDA-shaped pass: one invocation per output point computes its coordinates once, then walks
# the channels in order, adding each one's dx taps with float atomics and its grid-gradient
# terms into grad_grid's sums (the ordered blocks of @dgrid_points_gpu: the same bits), in
# GPU_POINTS_WORKGROUP-invocation workgroups.  Elsewhere @dx_atomic and @dgrid_points_gpu (an
# invocation per grad_output element for dx) suit lavapipe's 8-wide invocations better.  Every
# GPU module with atomic dx exports `_points`: tests run it on Vulkan by adding vulkan-spirv here.
GPU_POINTS_TARGETS = ("cuda",)
GPU_POINTS_WORKGROUP = 128
# Channels one invocation of the GPU grid sampler forward walks (its point's coordinates are
# computed once per block), few enough that no invocation runs long (lavapipe's loop budget).
GPU_FORWARD_CHANNEL_BLOCK = 16

# The manifest's "calls" record of a module (each spec's `calls(target)`, completed with the
# workspace by compiler.build.calls_record; docs/embedding.md): which exported function the
# runtime calls for a call's shapes and output mask, and each function's arguments in order,
# for hosts that have only the modules, the manifest and IREE's runtime.
CALLS_SCHEMA = 2  # 2: the "elements_at_most" condition
# The arguments after the tensors: the workspace (iree.abi.transients) and the coarse-fences ABI's fences.
_WORKSPACE_AND_FENCES = ({"name": "workspace", "role": "workspace", "type": "!hal.buffer"},
                         {"name": "wait_fence", "role": "wait_fence", "type": "!hal.fence"},
                         {"name": "signal_fence", "role": "signal_fence", "type": "!hal.fence"})
# The scales argument of the upsample modules: (rh, rw), what aclnn_iree.ops.upsample.upsample_scale gives.
_SCALES_VALUE = ("(rh, rw): for each axis, (in, out) = (H, H_out) then (W, W_out): 1 if in == out; else with "
                 "align_corners (in - 1) / (out - 1), or 0 if out == 1; else 1 / scale for a given scale > 0, "
                 "else in / out; computed in the scales' dtype")


# Where a grid sampler's (backward or forward) symbols are read: {symbol: [argument, axis]}.
_GRID_DIMS = {"N": ["input", 0], "C": ["input", 1], "H": ["input", 2], "W": ["input", 3],
              "H_out": ["grid", 1], "W_out": ["grid", 2]}


def _tensor_arg(name, shape, dtype, output=None) -> dict:
    """One tensor argument of a "calls" record: its shape in the record's dims (or integers)."""
    arg = {"name": name, "role": "input" if output is None else "output", "shape": list(shape), "dtype": dtype}
    if output is not None:
        arg["output_index"] = output
    return arg


def _calls(dims: dict, rules: list, signatures: dict) -> dict:
    """A "calls" record: `dims` {symbol: [argument, axis]}; `rules` in order (the first whose
    "when" holds is the call); `signatures` {function: its tensor arguments}."""
    functions = {name: {"arguments": [*args, *(dict(a) for a in _WORKSPACE_AND_FENCES)],
                        "results": [a["name"] for a in args if a["role"] == "output"]}
                 for name, args in signatures.items()}
    return {"schema": CALLS_SCHEMA, "dims": {k: list(v) for k, v in dims.items()}, "rules": rules,
            "functions": functions}


@dataclasses.dataclass(frozen=True)
class DTypeInfo:
    """How one storage dtype is computed (docs/semantics.md#half-precision-accumulates-in-float32).

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
    fields (at least `align_corners`, `dtype` and, last, `form`: one of FORMS), the class
    attribute `op` (its name in kernel names and its template folder's: the operator's name
    in the registry, aclnn_iree/ops/registry.py), and the classmethod
    `enumerate(dtypes)` (every specialisation of the tuned form, for all_specs)."""

    # {field: the values it may take}, each operator's own; checked on construction
    choices: dict = {}
    # the forms its template family has (templates/<op>/module.mlir.j2, linalg.mlir.j2)
    forms: tuple = FORMS

    def __post_init__(self):
        """Raises ValueError for a field outside its choices, KeyError for an unknown dtype."""
        for field, allowed in {**self.choices, "form": self.forms}.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} {getattr(self, field)!r} not in {allowed}")
        dtype_info(self.dtype)

    @property
    def linalg(self) -> bool:
        return self.form == "linalg"

    @property
    def template(self) -> str:
        """The root template of the module in its family's folder (named after the operator):
        `<op>/module.mlir.j2` (tuned) or `<op>/linalg.mlir.j2`."""
        return f"{self.op}/{'linalg' if self.linalg else 'module'}.mlir.j2"

    def compile_flags(self, target) -> tuple:
        """iree-compile's flags for this specialisation's module for `target`: the target's,
        and the linalg form's own (_LINALG_FLAGS)."""
        return tuple(target.flags) + (_LINALG_FLAGS if self.linalg else ())

    def for_target(self, target):
        """This specialisation as `target` builds and runs it: in its linalg form where the
        target has no tuned forms (Target.tuned); None where the target cannot compute its
        dtype (Target.dtypes)."""
        if self.dtype not in target.dtypes or not (target.tuned or "linalg" in self.forms):
            return None
        return self if target.tuned or self.linalg else dataclasses.replace(self, form="linalg")

    def serial_iterations(self, function: str, shapes) -> int:
        """Loop iterations the longest single invocation of `function` runs for tensors of
        these shapes (the call's, in its argument order), where the form runs work serially
        that grows with the call (0: none; see Device.loop_budget)."""
        return 0

    def in_form(self, form: str, function: str) -> tuple:
        """(specialisation, function) of this one in `form` (one of FORMS), for the call
        `function` (one of function_names()) makes: the linalg form exports each operator's
        base functions only, and the base function computes what a tuned pass of another name
        (`_points`, `_same_size`, `_deterministic`) does (linalg forms have one pass each)."""
        if form == self.form:
            return self, function
        if form not in self.forms:
            raise ValueError(f"{self.op} has no {form} form yet (its forms: {', '.join(self.forms)})")
        spec = dataclasses.replace(self, form=form)
        suffix = function[len(self.kernel_name):]
        if spec.linalg:
            for tuned_only in _TUNED_PASSES:
                suffix = suffix.replace(tuned_only, "")
        return spec, spec.kernel_name + suffix

    def _name(self, *parts) -> str:
        """`<op>_<parts>_ac0|ac1_<dtype>[_linalg]`: every specialisation parameter is in the name."""
        ac = "ac1" if self.align_corners else "ac0"
        return "_".join((self.op, *parts, ac, DTYPES[self.dtype].short) + (("linalg",) if self.linalg else ()))

    def _common_params(self, target) -> dict:
        """Template parameters every family takes (target None: a CPU target)."""
        d = DTYPES[self.dtype]
        return dict(kernel_name=self.kernel_name, align_corners=self.align_corners, storage_type=d.storage,
                    compute_type=d.compute, gpu=target is not None and target.is_gpu,
                    cpu_isa=None if target is not None and target.is_gpu else cpu_isa(),
                    gpu_workgroup=GPU_WORKGROUP_SIZE)


def _with_cpu_gather(params: dict, target) -> dict:
    """`params` with, on CPUs, `cpu_gather`: whether the CPU's own gather instructions may load
    the taps a CPU form gathers (targets.cpu_gathers; the grid samplers' and the upsample
    forward's templates read it)."""
    if not params["gpu"]:
        params["cpu_gather"] = cpu_gathers(target)
    return params


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
    form: str = "tuned"

    op = "grid_sampler_2d_backward"
    choices = {"interpolation_mode": INTERPOLATION_MODES, "padding_mode": PADDING_MODES}

    @property
    def kernel_name(self) -> str:
        return self._name(self.interpolation_mode, self.padding_mode)

    def function_name(self, output_mask=(True, True), deterministic: bool = False, target=None,
                      channels=None, elements=None) -> str:
        """The exported function computing the outputs selected by `output_mask`.

        CPU modules are always deterministic.  GPU modules (`target.is_gpu`) export
        the dx-computing functions twice: the default (float atomics where the target
        has them) and `..._deterministic` (a fixed summation order), picked by
        `deterministic`.  dgrid alone is deterministic everywhere; on CPUs, where
        dgrid_point_parallel says so for `channels` and `elements` (grad_output's; None:
        unknown, channels alone decide) it is `..._dgrid_points` (the same bits, no
        workspace), and both outputs with SPLIT_POINTS_CHANNELS `channels` are
        `<kernel>_points` (one pass: dx through a dx-only slot, grad_grid point-parallel
        from the same coordinates; the same bits).
        """
        mask = tuple(map(bool, output_mask))
        suffix = {(True, True): "", (True, False): "_dx", (False, True): "_dgrid"}[mask]
        if self.linalg:
            return self.kernel_name + suffix
        gpu = target is not None and target.is_gpu
        if deterministic and mask[0] and gpu:
            suffix += "_deterministic"
        elif gpu and mask == (True, True) and target.name in GPU_POINTS_TARGETS and self._gpu_points(target):
            suffix += "_points"
        if not gpu and self.interpolation_mode != "nearest" and channels is not None and (
                (mask == (False, True) and dgrid_point_parallel(self.interpolation_mode, channels, elements))
                or (mask == (True, True) and channels in SPLIT_POINTS_CHANNELS)):
            suffix += "_points"
        return self.kernel_name + suffix

    def _gpu_points(self, target) -> bool:
        """Whether the GPU module for `target` exports `<kernel>_points` (GPU_POINTS_TARGETS):
        a mode with a grid gradient, dx accumulated with the target's float atomics."""
        return self.interpolation_mode != "nearest" and DTYPES[self.dtype].accum in target.float_atomics

    def serial_iterations(self, function: str, shapes) -> int:
        """The linalg form's grad_input scatter: IREE runs a scatter with colliding indices
        serially, one invocation walking every update (N H_out W_out taps of them) and its
        channels, about (C + 3) loop iterations per update on lavapipe (measured)."""
        if not self.linalg or function.endswith("_dgrid"):
            return 0
        N, C = shapes[1][:2]
        Ho, Wo = shapes[2][1:3]
        return N * Ho * Wo * {"bilinear": 4, "nearest": 1, "bicubic": 16}[self.interpolation_mode] * (C + 3)

    def function_names(self, target=None) -> tuple:
        """Every function the module for `target` (default: a CPU target) exports."""
        names = (self.kernel_name, self.kernel_name + "_dx", self.kernel_name + "_dgrid")
        if self.linalg:
            return names
        if target is not None and target.is_gpu:
            names += (self.kernel_name + "_deterministic", self.kernel_name + "_dx_deterministic")
            if self._gpu_points(target):
                names += (self.kernel_name + "_points",)
        elif self.interpolation_mode != "nearest":
            names += (self.kernel_name + "_dgrid_points", self.kernel_name + "_points")
        return names

    def calls(self, target=None) -> dict:
        """The manifest's "calls" record of the module for `target` (default: a CPU target):
        function_name's choice and aclnn_iree.ops.grid_sampler.bind's (nothing to compute,
        zero-filled outputs) as rules over the output mask, the shapes and the host's
        `deterministic` (aclnn's ACL_OPT_DETERMINISTIC), first match wins; and each
        function's arguments (tests/test_embedding.py checks that they agree)."""
        dt, gpu = self.dtype, target is not None and target.is_gpu and not self.linalg
        inputs = [_tensor_arg("gradOutput", ("N", "C", "H_out", "W_out"), dt),
                  _tensor_arg("input", ("N", "C", "H", "W"), dt), _tensor_arg("grid", ("N", "H_out", "W_out", 2), dt)]
        output_shapes = {"inputGrad": ("N", "C", "H", "W"), "gridGrad": ("N", "H_out", "W_out", 2)}
        rules = [{"when": {"output_mask": [False, False]}, "function": None, "zero_fill": []}]
        signatures = {}
        for mask in ((True, True), (True, False), (False, True)):
            written = [name for name, m in zip(output_shapes, mask) if m]
            args = inputs + [_tensor_arg(name, output_shapes[name], dt, output=i) for i, name in enumerate(written)]
            when = {"output_mask": list(mask)}
            rules.append({"when": {**when, "any_zero": ["N", "C", "H_out", "W_out"]}, "function": None,
                          "zero_fill": written})
            forms = []
            if gpu and mask[0]:
                forms.append(({"deterministic": True}, "_deterministic"))
            if gpu and mask == (True, True) and target.name in GPU_POINTS_TARGETS and self._gpu_points(target):
                forms.append(({}, "_points"))
            if not gpu and not self.linalg and self.interpolation_mode != "nearest":
                points = (range(0, DGRID_POINTS_MAX_CHANNELS + 1) if mask == (False, True)
                          else SPLIT_POINTS_CHANNELS if mask == (True, True) else range(0))
                assert points.step == 1
                if len(points):
                    forms.append(({"range": {"C": [points.start, points.stop - 1]}}, "_points"))
                most = DGRID_POINTS_MAX_ELEMENTS.get(self.interpolation_mode)
                if mask == (False, True) and most is not None:
                    forms.append(({"elements_at_most": [["N", "C", "H_out", "W_out"], most]}, "_points"))
            forms.append(({}, ""))
            base = self.kernel_name + {(True, True): "", (True, False): "_dx", (False, True): "_dgrid"}[mask]
            for condition, suffix in forms:
                rules.append({"when": {**when, **condition}, "function": base + suffix})
                signatures[base + suffix] = args
        return _calls(_GRID_DIMS, rules, signatures)

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
            params["gpu_points_workgroup"] = GPU_POINTS_WORKGROUP
        return _with_cpu_gather(params, target)  # both directions' CPU forms gather taps


@dataclasses.dataclass(frozen=True)
class UpsampleSpec(KernelSpec):
    """One specialisation of upsample_bilinear2d_backward (aclnn V2).

    The module exports one function, `<kernel>`.
    """

    align_corners: bool
    dtype: str = "float32"
    layout: str = "NCHW"
    form: str = "tuned"

    op = "upsample_bilinear2d_backward"
    choices = {"layout": LAYOUTS}

    @property
    def kernel_name(self) -> str:
        return self._name(self.layout.lower())

    def function_name(self, same_size: bool = False) -> str:
        """The exported function for a call (a gather: deterministic on every target):
        `<kernel>_same_size` where neither axis is resized (`same_size`: H == H_out and
        W == W_out, where PyTorch maps each axis onto itself: one elementwise pass, the same
        bits), else the window passes."""
        return self.kernel_name + ("_same_size" if same_size and not self.linalg else "")

    def function_names(self, target=None) -> tuple:
        return (self.kernel_name,) if self.linalg else (self.kernel_name, self.kernel_name + "_same_size")

    def _layout_shape(self, h, w) -> tuple:
        return ("N", h, w, "C") if self.layout == "NHWC" else ("N", "C", h, w)

    def _scales_arg(self) -> dict:
        arg = _tensor_arg("scales", (2,), "float64" if self.dtype == "float64" else "float32")
        arg["value"] = _SCALES_VALUE
        return arg

    def calls(self, target=None) -> dict:
        """The manifest's "calls" record (see GridSamplerSpec.calls): function_name's choice and
        aclnn_iree.ops.upsample.bind's (empty tensors: out zero-filled)."""
        dt = self.dtype
        args = [_tensor_arg("gradOut", self._layout_shape("H_out", "W_out"), dt), self._scales_arg(),
                _tensor_arg("out", self._layout_shape("H", "W"), dt, output=0)]
        rules = [{"when": {"any_zero": ["N", "C"]}, "function": None, "zero_fill": ["out"]},
                 {"when": {"equal": [["H", "H_out"], ["W", "W_out"]]}, "function": self.function_name(same_size=True)},
                 {"when": {}, "function": self.function_name()}]
        if self.linalg:
            del rules[1]
        return _calls(self._layout_dims("out", "gradOut"), rules, {r["function"]: args for r in rules[1:]})

    def _layout_dims(self, full, resized) -> dict:
        """{symbol: [argument, axis]}: N, C, H, W from `full`, H_out, W_out from `resized`."""
        h, w, c = (1, 2, 3) if self.layout == "NHWC" else (2, 3, 1)
        return {"N": [full, 0], "C": [full, c], "H": [full, h], "W": [full, w], "H_out": [resized, h],
                "W_out": [resized, w]}

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

    def serial_iterations(self, function: str, shapes) -> int:
        """Nothing runs serially: the forward's forms are gathers."""
        return 0

    def function_name(self) -> str:
        return self.kernel_name

    def function_names(self, target=None) -> tuple:
        return (self.kernel_name,)

    def template_params(self, target=None) -> dict:
        """The grid sampler's parameters and `gpu_cblock` (GPU_FORWARD_CHANNEL_BLOCK)."""
        return dict(super().template_params(target), gpu_cblock=GPU_FORWARD_CHANNEL_BLOCK)

    def calls(self, target=None) -> dict:
        """The manifest's "calls" record (see GridSamplerSpec.calls): one function;
        aclnn_iree.ops.grid_sampler_forward.bind calls nothing for an empty output."""
        dt = self.dtype
        args = [_tensor_arg("input", ("N", "C", "H", "W"), dt), _tensor_arg("grid", ("N", "H_out", "W_out", 2), dt),
                _tensor_arg("out", ("N", "C", "H_out", "W_out"), dt, output=0)]
        rules = [{"when": {"any_zero": ["N", "C", "H_out", "W_out"]}, "function": None, "zero_fill": []},
                 {"when": {}, "function": self.function_name()}]
        return _calls(_GRID_DIMS, rules, {self.function_name(): args})


@dataclasses.dataclass(frozen=True)
class UpsampleBilinear2dSpec(UpsampleSpec):
    """One specialisation of upsample_bilinear2d (the forward, aclnnUpsampleBilinear2d): the
    module exports `<kernel>` (input, scales -> output) and, where CPU modules of the tuned
    form, `<kernel>_same_size` (see function_name)."""

    op = "upsample_bilinear2d"

    def template_params(self, target=None) -> dict:
        """The backward's parameters, and on CPUs `cpu_gather` (_with_cpu_gather)."""
        return _with_cpu_gather(super().template_params(target), target)

    def function_name(self, same_size: bool = False, target=None) -> str:
        """The exported function for a call: on CPUs (`target` None or not a GPU)
        `<kernel>_same_size` where neither axis is resized (`same_size`: H == H_out and
        W == W_out, where PyTorch samples each element itself with weights 1 and 0: one
        elementwise pass, the same bits), else the resampling pass.  GPUs run the one pass
        (an invocation per element either way)."""
        gpu = target is not None and target.is_gpu
        return self.kernel_name + ("_same_size" if same_size and not self.linalg and not gpu else "")

    def function_names(self, target=None) -> tuple:
        if self.linalg or (target is not None and target.is_gpu):
            return (self.kernel_name,)
        return (self.kernel_name, self.kernel_name + "_same_size")

    def calls(self, target=None) -> dict:
        """The manifest's "calls" record (see GridSamplerSpec.calls): function_name's choice;
        aclnn_iree.ops.upsample_forward.bind calls nothing for an empty output."""
        dt = self.dtype
        args = [_tensor_arg("self", self._layout_shape("H", "W"), dt), self._scales_arg(),
                _tensor_arg("out", self._layout_shape("H_out", "W_out"), dt, output=0)]
        rules = [{"when": {"any_zero": ["N", "C"]}, "function": None, "zero_fill": []},
                 {"when": {"equal": [["H", "H_out"], ["W", "W_out"]]},
                  "function": self.function_name(same_size=True, target=target)},
                 {"when": {}, "function": self.function_name(target=target)}]
        if len(self.function_names(target)) == 1:
            del rules[1]
        return _calls(self._layout_dims("self", "out"), rules, {r["function"]: args for r in rules[1:]})


Spec = Union[GridSamplerSpec, UpsampleSpec, GridSampler2dSpec, UpsampleBilinear2dSpec]


def all_specs(ops=None, dtypes=None, forms=("tuned",)) -> Iterator[Spec]:
    """Every specialisation that exists, optionally filtered by operator and dtype names: each
    operator of the registry (aclnn_iree.ops.registry) in its order, its spec class's
    `enumerate(dtypes)`, in each of `forms` (default: the tuned form only).  Raises KeyError
    for an unknown operator or dtype, ValueError for an unknown form."""
    from ..ops.registry import OPERATORS, get
    dtypes = tuple(dtypes or DTYPES)
    for dt in dtypes:
        dtype_info(dt)
    for form in forms:
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    wanted = {get(name).name for name in ops} if ops else None
    for op in OPERATORS:
        if wanted is None or op.name in wanted:
            for spec in op.spec.enumerate(dtypes):
                yield from (spec if form == "tuned" else dataclasses.replace(spec, form=form)
                            for form in forms if form in spec.forms)
