"""The stream launch of CUDA modules (runtime.cuda, aclnn_iree.torch._cuda), checked without a
GPU against what the modules and templates say: each PTX entry's parameters and workgroup size,
the arguments packed for it as IREE's CUDA HAL passes them, and the dispatches the launch path
issues for an exported function against the ones its template's host function issues.  The
launches themselves run on a GPU only (scripts/gpu_check.sh, test_torch.py's cuda tests with
ACLNN_IREE_CUDA_LAUNCH=stream)."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest
import torch

from aclnn_iree.compiler.build import ArtifactStore
from aclnn_iree.compiler.reflect import ptx_images
from aclnn_iree.compiler.render import render
from aclnn_iree.compiler.specs import (GPU_POINTS_WORKGROUP, GPU_WORKGROUP_SIZE, GridSampler2dSpec, GridSamplerSpec, UpsampleBilinear2dSpec,
                                       UpsampleSpec)
from aclnn_iree.compiler.targets import get_target
from aclnn_iree.runtime import cuda
from aclnn_iree.runtime.store import cache_dir
from aclnn_iree.torch import _cuda
from aclnn_iree.torch import grid_sampler as TG
from aclnn_iree.torch import upsample as TU
from test_devices import cuda_sample

CUDA = get_target("cuda")
TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@pytest.fixture(scope="module")
def modules():
    """{kernel_name: (spec, vmfb bytes)} of the CUDA sample (every mode, padding, dtype and
    layout of the four operators), from the suite's compile cache."""
    specs = cuda_sample()
    store = ArtifactStore(cache_dir())
    res = store.build(specs, [CUDA], progress=False)
    assert res.failed == []
    return {s.kernel_name: (s, store.get_or_build(s, CUDA)) for s in specs}


def _entries(vmfb: bytes) -> dict:
    entries = {}
    for ptx in ptx_images(vmfb):
        entries.update(cuda.ptx_entries(ptx))
    return entries


# ----------------------------------------------------------------------------- PTX entries
def test_every_entry_is_launchable_as_iree_does(modules):
    """Every kernel of every sampled module parses (binding addresses, then 32-bit constants, a
    workgroup size; IREE's own dispatches too, e.g. a rounding pass), and each dispatch the
    stream launch issues takes as many bindings and constants as its Dispatch passes, in
    GPU_WORKGROUP_SIZE-thread workgroups (the hand-written forms' translation_info; the
    one-pass dx_dgrid_points in GPU_POINTS_WORKGROUP)."""
    checked = set()
    for name, (spec, vmfb) in modules.items():
        entries = _entries(vmfb)
        assert entries, name
        for e in entries.values():
            assert e.bindings >= 1 and not any(e.params[e.bindings:]), (name, e)
        params = spec.template_params(CUDA)
        for function in spec.function_names(CUDA):
            for step in _cuda.dispatches(spec, params, function) or ():
                e = entries[step.entry]
                block = GPU_POINTS_WORKGROUP if step.entry == "dx_dgrid_points" else GPU_WORKGROUP_SIZE
                assert (e.bindings, e.constants, e.block) == (step.bindings, len(_cuda.SIZES), (block, 1, 1))
                assert all(a == 16 for a in e.params[:e.bindings]), (name, e)  # the bindings' alignment(16)
                checked.add((spec.op, step.entry))
    assert checked == {("grid_sampler_2d_backward", "dx_atomic"), ("grid_sampler_2d_backward", "dgrid_points_gpu"),
                       ("grid_sampler_2d_backward", "dx_dgrid_points"), ("grid_sampler_2d", "sample_gpu"),
                       ("upsample_bilinear2d", "upsample")}


def test_ptx_entries_reads_parameters_and_block():
    ptx = """.visible .entry k(
\t.param .u64 .ptr .align 16 k_param_0,
\t.param .u64 k_param_1,
\t.param .b32 k_param_2
)
.maxntid 128, 2, 1
{
\tret;
}
.visible .entry j()
.reqntid 32
{ ret; }
"""
    e = cuda.ptx_entries(ptx)
    assert e["k"] == cuda.Entry("k", (16, 8, 0), (128, 2, 1))
    assert e["k"].bindings == 2 and e["k"].constants == 1
    assert e["j"] == cuda.Entry("j", (), (32, 1, 1))


@pytest.mark.parametrize("ptx, message", [
    (".visible .entry k(.param .f32 k_p0)\n.maxntid 64, 1, 1\n{}", "neither a binding address"),
    (".visible .entry k(.param .b32 k_p0, .param .u64 .ptr .align 16 k_p1)\n.maxntid 64, 1, 1\n{}",
     "binding address after a push constant"),
    (".visible .entry k(.param .u64 k_p0)\n{}", "no workgroup size"),
])
def test_ptx_entries_refuses_what_it_cannot_launch(ptx, message):
    with pytest.raises(ValueError, match=message):
        cuda.ptx_entries(ptx)


# ----------------------------------------------------------------------------- packing
def test_pack_puts_each_value_in_its_own_8_byte_slot():
    e = cuda.Entry("k", (16, 16, 0, 0), (64, 1, 1))
    p = cuda.pack(e, [0x7F0000001000, 0x7F0000002010], [5, -1])
    params = [p.params[i] for i in range(4)]
    assert params == [ctypes.addressof(p.slots) + 8 * i for i in range(4)]  # kernelParams[i] -> slot i
    assert ctypes.c_uint64.from_address(params[0]).value == 0x7F0000001000
    assert ctypes.c_uint64.from_address(params[1]).value == 0x7F0000002010
    assert ctypes.c_uint32.from_address(params[2]).value == 5  # a constant's 32 bits, little-endian, at its slot
    assert ctypes.c_int32.from_address(params[3]).value == -1


@pytest.mark.parametrize("addresses, constants, message", [
    ([16], [1, 2], "takes 2 bindings and 2 push constants, not 1 and 2"),
    ([16, 32], [1], "not 2 and 1"),
    ([16, 40], [1, 2], "binding 1's address 0x28 is not a device address aligned to 16"),
    ([0, 32], [1, 2], "binding 0's address 0x0"),
    ([16, 32], [1, 1 << 32], "push constant 1 .* does not fit in 32 bits"),
    ([16, 32], [-(1 << 31) - 1, 2], "push constant 0"),
])
def test_pack_refuses_arguments_the_entry_does_not_take(addresses, constants, message):
    with pytest.raises(ValueError, match=message):
        cuda.pack(cuda.Entry("k", (16, 16, 0, 0), (64, 1, 1)), addresses, constants)


def test_workgroups_follow_the_count_region():
    common = (TEMPLATES / "_common.mlir.j2").read_text()
    assert int(re.search(r"set max_workgroups = (\d+)", common).group(1)) == cuda.MAX_WORKGROUPS
    assert cuda.workgroups(0, 64) == 1  # at least one workgroup (gpu_count's maxui with 1)
    assert cuda.workgroups(64, 64) == 1 and cuda.workgroups(65, 64) == 2
    assert cuda.workgroups(64 * cuda.MAX_WORKGROUPS * 3, 64) == cuda.MAX_WORKGROUPS


# ----------------------------------------------------------------------------- dispatches vs templates
_FUNC = re.compile(r"^util\.func public @(\w+)\(", re.M)
_DISPATCH = re.compile(r"(%\w+(?:, %\w+)*) = flow\.dispatch @\w+::@(\w+)\[%(\w+)\]\(([^)]*)\)\s*:\s*\([^)]*\)\s*->\s*"
                       r"(\([^\n]*\)|[^\n]*)")


def _results(types: str) -> list:
    """The result types of a dispatch (`-> A` or `-> (A, B)`), split at the commas outside
    braces and angle brackets."""
    types = types.strip()
    if types.startswith("("):
        types = types[1:-1]
    parts, depth, cur = [], 0, ""
    for ch in types:
        depth += ch in "{<" and 1 or ch in "}>" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()]


def _template_dispatches(mlir: str, function: str) -> list:
    """[(entry, work, operands, new result)] of exported `function`'s flow.dispatch ops, in
    order: a result tied to an operand (`-> %operand{...}`) is not a new one."""
    starts = [(m.group(1), m.start()) for m in _FUNC.finditer(mlir)]
    (start,) = [s for n, s in starts if n == function]
    end = min([s for _, s in starts if s > start], default=len(mlir))
    out = []
    for m in _DISPATCH.finditer(mlir, start, end):
        lhs, entry, work, operands, types = m.groups()
        names = tuple(o.strip().lstrip("%") for o in operands.split(","))
        new = [r.lstrip("%") for r, t in zip(lhs.split(", "), _results(types)) if not t.startswith("%")]
        assert len(new) <= 1, m.group(0)
        out.append((entry, work, names, new[0] if new else None))
    return out


GPU_SPECS = [GridSamplerSpec(m, p, ac, dt) for m in ("bilinear", "nearest", "bicubic")
             for p in ("zeros", "reflection") for ac in (False, True) for dt in ("float32", "float16", "float64")]
GPU_SPECS += [GridSampler2dSpec("bicubic", "border", True, "bfloat16"), GridSampler2dSpec("bilinear", "zeros", False)]
GPU_SPECS += [UpsampleBilinear2dSpec(ac, dt, lay) for ac in (False, True) for dt in ("float32", "bfloat16")
              for lay in ("NCHW", "NHWC")]
GPU_SPECS += [UpsampleSpec(False, "float32", "NCHW")]


@pytest.mark.parametrize("spec", GPU_SPECS, ids=lambda s: s.kernel_name)
def test_dispatches_are_the_templates(spec):
    """Each exported function the stream launch takes issues exactly the template's dispatches
    (entries, work counts, operands by name, tied or new results); the others stay IREE's."""
    params = spec.template_params(CUDA)
    mlir = render(spec, CUDA)
    taken = 0
    for function in spec.function_names(CUDA):
        steps = _cuda.dispatches(spec, params, function)
        if steps is None:
            continue
        taken += 1
        assert [(s.entry, s.work, s.operands, s.result) for s in steps] == _template_dispatches(mlir, function), function
    # what the stream launch takes: both forwards, the grid backward's atomic functions
    if spec.op == "upsample_bilinear2d_backward":
        assert taken == 0
    elif spec.op == "grid_sampler_2d_backward":
        points = params["atomic_dx"] and spec.interpolation_mode != "nearest"
        assert taken == (4 if points else 3 if params["atomic_dx"] else 1)
    else:
        assert taken == 1


def test_deterministic_and_ordered_forms_stay_on_iree():
    s = GridSamplerSpec("bilinear", "zeros", False)
    params = s.template_params(CUDA)
    assert _cuda.dispatches(s, params, s.kernel_name + "_deterministic") is None
    assert _cuda.dispatches(s, params, s.kernel_name + "_dx_deterministic") is None
    assert _cuda.dispatches(s, {**params, "atomic_dx": False}, s.kernel_name) is None
    assert _cuda.dispatches(s, {**params, "atomic_dx": False}, s.kernel_name + "_dgrid") == (TG.GRID_DGRID,)
    n = GridSamplerSpec("nearest", "zeros", False)
    assert _cuda.dispatches(n, n.template_params(CUDA), n.kernel_name) == (TG.GRID_DX_ATOMIC,)  # grad_grid: zeros


# ----------------------------------------------------------------------------- a call's launches vs the PTX
class _Recorded:
    """Stands in for a loaded Executable where no GPU is: packs each launch against the module's
    own PTX entry (what cuLaunchKernel would get) and keeps it."""

    def __init__(self, entries):
        self.entries, self.launched = entries, []

    def launch(self, name, work, addresses, constants, stream):
        self.launched.append((name, cuda.workgroups(work, self.entries[name].block[0]),
                              cuda.pack(self.entries[name], addresses, constants)))


def _plan(modules, spec, function=None):
    """The CudaPlan of `function` (default: the module's first) of the sampled CUDA module of
    `spec`, launching into a _Recorded; and the module's PTX entries."""
    entries = _entries(modules[spec.kernel_name][1])
    params = spec.template_params(CUDA)
    steps = _cuda.dispatches(spec, params, function or spec.function_names(CUDA)[0])
    op = TG if spec.op.startswith("grid") else TU
    scales = {"scales": torch.tensor([0.5, 0.5])} if spec.op == "upsample_bilinear2d" else {}
    return _cuda.CudaPlan(steps, op.cuda_operands(spec, params, **scales), _Recorded(entries)), entries


def _slots(packed, n):
    return [packed.slots[i] for i in range(n)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_grid_backward_launches(modules, dtype):
    """Tensors in binding order, the six sizes, workgroups covering the work: checked against
    the sample's own module; grad_input zeroed first, or (float16) accumulated in a zeroed
    float32 tensor that finish() rounds into it."""
    spec = next(s for s in (s for s, _ in modules.values()) if s.op == "grid_sampler_2d_backward"
                and s.interpolation_mode == "bilinear" and s.dtype == dtype)
    plan, entries = _plan(modules, spec)
    t = getattr(torch, dtype)
    go, x, g = torch.randn(2, 3, 5, 7, dtype=t), torch.randn(2, 3, 4, 6, dtype=t), torch.rand(2, 5, 7, 2, dtype=t)
    dx, dgrid = torch.full_like(x, float("nan")), torch.empty_like(g)
    launches, finish = plan.launches((go, x, g), (dx, dgrid))
    acc = launches[0][2][2]
    assert (acc == dx.data_ptr()) == (dtype != "float16") and (finish is None) == (dtype != "float16")
    if finish is not None:
        assert dx.isnan().all()
        finish()  # the float32 accumulator (zeros: nothing was launched) rounded into dx
    assert not dx.any()
    sizes = [2, 3, 4, 6, 5, 7]
    assert [(e, w) for e, w, _, _ in launches] == [("dx_atomic", 2 * 3 * 35), ("dgrid_points_gpu", 2 * 35)]
    assert launches[0][2:] == ([go.data_ptr(), g.data_ptr(), acc], sizes)
    assert launches[1][2:] == ([go.data_ptr(), x.data_ptr(), g.data_ptr(), dgrid.data_ptr()], sizes)
    for entry, work, addresses, constants in launches:
        assert _slots(cuda.pack(entries[entry], addresses, constants), 3 + 6 + (entry != "dx_atomic")) == addresses + sizes
    # CUDA's calls of both gradients: the one-pass function (specs.GPU_POINTS_TARGETS)
    function = spec.function_name((True, True), False, CUDA)
    assert function == spec.kernel_name + "_points"
    plan, _ = _plan(modules, spec, function)
    (launch,), _ = plan.launches((go, x, g), (dx, dgrid))
    acc = launch[2][3]
    assert launch == ("dx_dgrid_points", 2 * 35, [go.data_ptr(), x.data_ptr(), g.data_ptr(), acc, dgrid.data_ptr()],
                      sizes)
    assert _slots(cuda.pack(entries["dx_dgrid_points"], *launch[2:]), 11) == launch[2] + sizes


def test_forward_launches(modules):
    fwd = next(s for s, _ in modules.values() if s.op == "grid_sampler_2d" and s.dtype == "float32")
    plan, entries = _plan(modules, fwd)
    x, g = torch.randn(1, 40, 8, 9), torch.rand(1, 3, 4, 2)
    out = torch.empty(1, 40, 3, 4)
    (launch,), _ = plan.launches((x, g), (out,))
    # one work item per (point, block of gpu_cblock channels), as the host function counts them
    assert launch == ("sample_gpu", 3 * 4 * -(-40 // fwd.template_params(CUDA)["gpu_cblock"]),
                      [x.data_ptr(), g.data_ptr(), out.data_ptr()], [1, 40, 8, 9, 3, 4])
    cuda.pack(entries["sample_gpu"], *launch[2:])
    for layout, x, out, sizes in (("NHWC", torch.randn(2, 4, 5, 3), torch.empty(2, 8, 10, 3), [2, 3, 4, 5, 8, 10]),
                                  ("NCHW", torch.randn(2, 3, 4, 5), torch.empty(2, 3, 8, 10), [2, 3, 4, 5, 8, 10])):
        up = next(s for s, _ in modules.values() if s.op == "upsample_bilinear2d" and s.layout == layout)
        plan, entries = _plan(modules, up)
        (launch,), _ = plan.launches((x,), (out,))  # NHWC as (N, H, W, C)
        assert launch[:2] == ("upsample", 2 * 3 * 8 * 10) and launch[3] == sizes, layout
        assert launch[2][0] == x.data_ptr() and launch[2][2] == out.data_ptr(), layout
        cuda.pack(entries["upsample"], *launch[2:])


def test_plan_declines_empty_and_misaligned_tensors_and_the_iree_launch(modules, monkeypatch):
    spec = next(s for s, _ in modules.values() if s.op == "grid_sampler_2d" and s.dtype == "float32")
    plan, _ = _plan(modules, spec)
    x, g = torch.randn(1, 2, 3, 3), torch.rand(1, 2, 2, 2)
    monkeypatch.setenv(_cuda.LAUNCH_ENV, "iree")
    assert plan((x, g), (torch.empty(1, 2, 2, 2),)) is False  # switched back since the plan was made
    monkeypatch.setenv(_cuda.LAUNCH_ENV, "stream")
    assert plan((x, g[:, :0]), (torch.empty(1, 2, 0, 2),)) is False
    buf = torch.empty(1 + 18)
    assert plan((buf[1:].view(1, 2, 3, 3), g), (torch.empty(1, 2, 2, 2),)) is False  # 4 bytes off 16
    assert plan._exe.launched == []


# ----------------------------------------------------------------------------- the driver and the switch
def test_a_missing_driver_library_is_one_clear_error():
    with pytest.raises(cuda.CudaError, match="libcuda_missing.so.1 cannot be loaded .* no NVIDIA driver here"):
        cuda.Driver("libcuda_missing.so.1")


def test_launch_switch(monkeypatch):
    monkeypatch.delenv(_cuda.LAUNCH_ENV, raising=False)
    assert _cuda.stream_launch() is False  # IREE's runtime until the stream launch has run on a GPU
    monkeypatch.setenv(_cuda.LAUNCH_ENV, "stream")
    assert _cuda.stream_launch() is True
    monkeypatch.setenv(_cuda.LAUNCH_ENV, "graphs")
    with pytest.raises(ValueError, match="ACLNN_IREE_CUDA_LAUNCH='graphs': expected one of iree, stream"):
        _cuda.stream_launch()


def test_a_module_the_driver_cannot_load_leaves_the_calls_on_iree(monkeypatch):
    """The first call of a signature on CUDA tensors ran through IREE's runtime; where its stream
    launch cannot be made (no driver, PTX the driver refuses) later calls stay there, with one
    warning, and nothing is remembered as the signature's plan."""
    from aclnn_iree.torch import _bridge

    class Launch:
        cuda_index = 0

    def refuse(ex, index, event):
        raise cuda.CudaError("cuModuleLoadData failed: CUDA_ERROR_INVALID_PTX (218)")

    monkeypatch.setattr(_bridge, "_warned", set())
    monkeypatch.delenv(_cuda.LAUNCH_ENV, raising=False)
    assert _bridge.planner(("op", "cuda"), Launch(), torch.float32) is None  # the default: IREE's runtime
    monkeypatch.setenv(_cuda.LAUNCH_ENV, "stream")
    monkeypatch.setattr(_cuda, "plan_for", refuse)
    kept = _bridge.planner(("grid_sampler_2d", "cuda"), Launch(), torch.float32)
    with pytest.warns(RuntimeWarning, match="cannot be launched on PyTorch's stream .*INVALID_PTX.*IREE's runtime"):
        kept(None, None)
    kept(None, None)  # warned once
    assert _bridge.plan(("grid_sampler_2d", "cuda")) is None


def test_linalg_forms_and_missing_kernels_take_no_stream_launch(modules, monkeypatch):
    """A linalg form's module holds IREE's own dispatches: no stream launch; a module without a
    kernel a step launches (or taking other arguments) is refused when the plan is made, not at
    a later call."""
    import dataclasses
    import types
    from aclnn_iree.runtime import kernels
    for s in (GridSamplerSpec("bilinear", "zeros", False), GridSampler2dSpec("bilinear", "zeros", False),
              UpsampleBilinear2dSpec(False)):
        lin = dataclasses.replace(s, form="linalg")
        assert _cuda.dispatches(lin, lin.template_params(CUDA), lin.function_names(CUDA)[0]) is None
    fwd = next(s for s, _ in modules.values() if s.op == "grid_sampler_2d" and s.dtype == "float32")
    bwd = next(s for s, _ in modules.values() if s.op == "grid_sampler_2d_backward" and s.dtype == "float32"
               and s.interpolation_mode == "bilinear")
    monkeypatch.setattr(cuda, "executable", lambda key, index, images: types.SimpleNamespace(
        entries={k: v for ptx in images for k, v in cuda.ptx_entries(ptx).items()}))

    def executor(spec, vmfb):  # a kept executor of `spec` whose module holds `vmfb`'s PTX
        module = types.SimpleNamespace(spec=spec, target=CUDA, path="m.vmfb",
                                       cuda_image=lambda: (("m.vmfb", "0"), tuple(ptx_images(vmfb))))
        return types.SimpleNamespace(kernel=types.SimpleNamespace(module=module, name=spec.kernel_name))
    plan = _cuda.plan_for(executor(fwd, modules[fwd.kernel_name][1]), 0, "e")
    assert isinstance(plan, _cuda.CudaPlan)
    with pytest.raises(ValueError, match="has no kernel sample_gpu taking the arguments"):
        _cuda.plan_for(executor(fwd, modules[bwd.kernel_name][1]), 0, "e")  # another module in its place
    monkeypatch.setenv(_cuda.LAUNCH_ENV, "stream")
    monkeypatch.setattr(kernels, "generation", kernels.generation + 1)  # the modules were unloaded since
    x, g = torch.randn(1, 2, 3, 3), torch.rand(1, 2, 2, 2)
    assert plan((x, g), (torch.empty(1, 2, 2, 2),)) is False
