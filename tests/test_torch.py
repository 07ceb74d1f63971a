"""aclnn_iree.torch: our backward kernels inside autograd, torch.compile and DDP (docs/pytorch.md).

Oracles: PyTorch 2.13's own autograd (F.grid_sample / F.interpolate and the aten backward
ops) and the float64 reference, with the dtype-derived bounds of tests/test_dtypes.py;
bitwise equality with the Pythonic call on the same data proves that our kernel ran.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import aclnn_iree  # noqa: E402
import aclnn_iree.torch as AT  # noqa: E402
from aclnn_iree.torch import _bridge  # noqa: E402
from conftest import require_device  # noqa: E402
from test_dtypes import (BF16, F16, F32, F64, _torch_dtype, check_f64, check_half, error_bound, grid_case,  # noqa: E402
                         upsample_case)

DTYPES = [F16, BF16, F32, F64]
MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}
PADS = {"zeros": 0, "border": 1, "reflection": 2}
OPS = torch.ops.aclnn_iree


def _t(a: np.ndarray, dtype, **kw):
    """A torch tensor of `dtype` holding the (already rounded) values of `a`."""
    return torch.from_numpy(np.ascontiguousarray(a.astype(np.float64))).to(_torch_dtype(dtype)).requires_grad_(
        kw.get("grad", False))


def _np(t):
    return t.detach().double().numpy()


def _assert_bits(ours_torch, ours_numpy, what):
    a = ours_torch.detach()
    a = a.view(torch.int16).numpy() if a.dtype == torch.bfloat16 else a.numpy()
    b = np.ascontiguousarray(ours_numpy)
    b = b.view(np.int16) if b.dtype == BF16 else b
    assert a.shape == b.shape and a.tobytes() == b.tobytes(), f"{what}: not the Pythonic call's bits"


def _check_bound(out, refv, sums, dtype, torch_out, what):
    """ours within the dtype-derived bound of the reference; ours within that bound plus
    PyTorch's own error of PyTorch (the triangle inequality: neither side is tuned)."""
    o = _np(out)
    if dtype == F64:
        check_f64(o, refv, what)
        bound = np.full(refv.shape, 1e-12 * float(np.max(np.abs(refv), initial=0.0)))
    else:
        check_half(o.astype(dtype), refv, *sums, dtype, what)
        bound = error_bound(refv, *sums, dtype)[0]
    t = _np(torch_out)
    slack = bound + np.abs(t - refv)
    finite = np.isfinite(t) & np.isfinite(o)
    bad = finite & (np.abs(o - t) > slack)
    assert not bad.any(), f"{what}: differs from PyTorch beyond both errors, e.g. {o[bad][:3]} vs {t[bad][:3]}"


# ----------------------------------------------------------------------------- opcheck
def _opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("mask", [[True, True], [True, False], [False, True]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_grid_sampler_ops(mask, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 5, dtype=dtype, generator=g)
    grid = (torch.rand(2, 4, 3, 2, dtype=dtype, generator=g) * 2.4 - 1.2)
    go = torch.randn(2, 3, 4, 3, dtype=dtype, generator=g)
    _opcheck(OPS.grid_sampler_2d_backward.default, (go, x, grid, 0, 2, False, mask))
    _opcheck(OPS.grid_sampler_2d.default, (x.requires_grad_(mask[0]), grid.requires_grad_(mask[1]), 2, 1, True))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("scales", [None, 2.0])
def test_opcheck_upsample_ops(layout, scales):
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    x = torch.randn(2, 3, 5, 7).contiguous(memory_format=fmt)
    go = torch.randn(2, 3, 10, 14).contiguous(memory_format=fmt)
    _opcheck(OPS.upsample_bilinear2d_backward.default, (go, [10, 14], [2, 3, 5, 7], False, scales, scales))
    _opcheck(OPS.upsample_bilinear2d.default, (x.requires_grad_(True), [10, 14], False, scales, scales))
    _opcheck(OPS.upsample_bilinear2d.default, (x, [4, 9], True, None, None))


# ----------------------------------------------------------------------------- gradcheck (float64)
@pytest.mark.parametrize("mode,pad,ac", list(itertools.product(MODES, PADS, (False, True))))
def test_gradcheck_grid_sample(mode, pad, ac):
    g = torch.Generator().manual_seed(hash((mode, pad, ac)) % 2**31)
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    # random points (never on a kink: integer or half-integer pixel coordinates, borders)
    grid = (torch.rand(1, 3, 3, 2, dtype=torch.float64, generator=g) * 2.6 - 1.3).requires_grad_(True)
    fn = lambda a, b: AT.grid_sample(a, b, mode=mode, padding_mode=pad, align_corners=ac)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, grid), eps=1e-6, atol=1e-7, rtol=1e-6)


# ----------------------------------------------------------------------------- double backward
def _second_order(fn, inputs, seed):
    """Gradients of a nonlinear function of the first-order gradients (a gradient penalty):
    create_graph=True differentiates the backward ops themselves.  The loss is quadratic in
    the output, so that the first-order gradients depend on the inputs through grad_output
    too (the upsample's backward is linear in grad_output alone).  Unused inputs: zeros."""
    first = torch.autograd.grad((fn(*inputs) ** 2 * seed).sum(), inputs, create_graph=True)
    penalty = sum((g * g).sum() + g.sum() for g in first)
    grads = torch.autograd.grad(penalty, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs)]


@pytest.mark.parametrize("mode,pad", list(itertools.product(MODES, PADS)))
def test_double_backward_of_grid_sample_is_pytorchs(mode, pad):
    """Second-order gradients through our backward equal PyTorch's own double backward (they
    were silently zero when the backward ops had no formula), and pass gradgradcheck."""
    g = torch.Generator().manual_seed(hash((mode, pad)) % 2**31)
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    grid = (torch.rand(1, 3, 3, 2, dtype=torch.float64, generator=g) * 2.6 - 1.3).requires_grad_(True)
    seed = torch.randn(1, 2, 3, 3, dtype=torch.float64, generator=g)
    ours = lambda a, b: AT.grid_sample(a, b, mode=mode, padding_mode=pad)  # noqa: E731
    theirs = lambda a, b: F.grid_sample(a, b, mode=mode, padding_mode=pad, align_corners=False)  # noqa: E731
    got, want = _second_order(ours, (x, grid), seed), _second_order(theirs, (x, grid), seed)
    for a, b, name in zip(got, want, ("input", "grid")):
        assert b.abs().max() > 0 or (mode, name) == ("nearest", "grid")  # nearest: piecewise constant in grid
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * max(1.0, b.abs().max().item()))
    assert torch.autograd.gradgradcheck(ours, (x, grid), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("how", [{"size": (7, 3)}, {"scale_factor": 1.7, "align_corners": True}], ids=["size", "scale"])
def test_double_backward_of_interpolate_is_pytorchs(how):
    x = torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    seed = torch.randn(F.interpolate(x, mode="bilinear", **how).shape, dtype=torch.float64)
    got = _second_order(lambda a: AT.interpolate(a, **how), (x,), seed)[0]
    want = _second_order(lambda a: F.interpolate(a, mode="bilinear", **how), (x,), seed)[0]
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * want.abs().max().item())
    assert torch.autograd.gradgradcheck(lambda a: AT.interpolate(a, **how), (x,), eps=1e-6, atol=1e-8, rtol=1e-7)


@pytest.mark.parametrize("how", [{"size": (7, 3)}, {"size": 9}, {"scale_factor": 1.7}, {"scale_factor": (0.6, 2.5)},
                                 {"scale_factor": 1.7, "recompute_scale_factor": True}],
                         ids=["size", "size-int", "scale", "scales", "recompute"])
@pytest.mark.parametrize("ac", [False, True])
def test_gradcheck_interpolate(how, ac):
    x = torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    fn = lambda a: AT.interpolate(a, mode="bilinear", align_corners=ac, **how)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-8, rtol=1e-7)
    # the output size and the scales handed to the backward are F.interpolate's
    want = F.interpolate(x, mode="bilinear", align_corners=ac, **how)
    assert fn(x).shape == want.shape


# ----------------------------------------------------------------------------- accuracy, all dtypes
GRID_VARIANTS = [(0, 0, False), (0, 2, True), (1, 1, False), (2, 2, False), (2, 0, True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("mode,pad,ac", GRID_VARIANTS)
def test_grid_sample_gradients_match_pytorch_and_our_kernel(mode, pad, ac, dtype):
    case = grid_case(mode, pad, ac, "random")
    go, x, grid = case.inputs(dtype)
    name = {v: k for k, v in MODES.items()}[mode], {v: k for k, v in PADS.items()}[pad]
    xt, gt = _t(x, dtype, grad=True), _t(grid, dtype, grad=True)
    AT.grid_sample(xt, gt, mode=name[0], padding_mode=name[1], align_corners=ac).backward(_t(go, dtype))
    dx, dg = aclnn_iree.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)
    _assert_bits(xt.grad, dx, "grad_input")
    _assert_bits(gt.grad, dg, "grad_grid")
    xr, gr = _t(x, dtype, grad=True), _t(grid, dtype, grad=True)
    F.grid_sample(xr, gr, mode=name[0], padding_mode=name[1], align_corners=ac).backward(_t(go, dtype))
    refs, sums = case.reference(dtype), case.abs_sums(dtype)
    _check_bound(xt.grad, refs["dx"], sums["dx"], dtype, xr.grad, f"{case.label} {dtype.name} dx")
    _check_bound(gt.grad, refs["dgrid"], sums["dgrid"], dtype, gr.grad, f"{case.label} {dtype.name} dgrid")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("direction,ac", [("up", False), ("down", True)])
def test_interpolate_gradients_match_pytorch_and_our_kernel(direction, ac, layout, dtype):
    case = upsample_case(direction, "random", ac, layout)
    (go,) = case.inputs(dtype)
    (Ho, Wo), (N, C, H, W) = case.sizes
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    xt = torch.zeros((N, C, H, W), dtype=_torch_dtype(dtype)).contiguous(memory_format=fmt).requires_grad_(True)
    out = AT.interpolate(xt, size=(Ho, Wo), align_corners=ac)
    out.backward(_t(go, dtype).contiguous(memory_format=fmt))
    assert xt.grad.is_contiguous(memory_format=fmt)
    _assert_bits(xt.grad.contiguous(), case.ours(dtype)["dx"], "grad_input")
    xr = torch.zeros_like(xt).requires_grad_(True)
    F.interpolate(xr, size=(Ho, Wo), mode="bilinear", align_corners=ac).backward(_t(go, dtype).contiguous(
        memory_format=fmt))
    _check_bound(xt.grad, case.reference(dtype)["dx"], case.abs_sums(dtype)["dx"], dtype, xr.grad,
                 f"{case.label} {dtype.name}")


# ----------------------------------------------------------------------------- layouts, masks, copies
def test_output_mask_follows_needs_input_grad(monkeypatch):
    """A gradient autograd does not need is never computed."""
    seen = []
    from aclnn_iree.torch import grid_sampler as torch_grid_sampler
    real = torch_grid_sampler.grid_sampler_backward
    monkeypatch.setattr(torch_grid_sampler, "grid_sampler_backward", lambda *a: seen.append(list(a[-1])) or real(*a))
    x, g = torch.randn(1, 2, 5, 5), torch.rand(1, 3, 3, 2) * 2 - 1
    for xr, gr in ((True, False), (False, True), (True, True)):
        xi, gi = x.clone().requires_grad_(xr), g.clone().requires_grad_(gr)
        AT.grid_sample(xi, gi).sum().backward()
        assert (xi.grad is not None, gi.grad is not None) == (xr, gr)
    assert seen == [[True, False], [False, True], [True, True]]


def test_channels_last_and_strided_inputs():
    g = torch.Generator().manual_seed(4)
    base = torch.randn(2, 3, 9, 12, generator=g)
    for x in (base.contiguous(memory_format=torch.channels_last), base[:, :, ::2, 1:]):
        grid = torch.rand(2, 4, 5, 2, generator=g) * 2 - 1
        xa, ga = x.clone().requires_grad_(True), grid.clone().requires_grad_(True)
        xb, gb = x.clone().requires_grad_(True), grid.clone().requires_grad_(True)
        AT.grid_sample(xa, ga, align_corners=True).square().sum().backward()
        F.grid_sample(xb, gb, align_corners=True).square().sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(ga.grad, gb.grad, rtol=2e-5, atol=2e-5)
        ya, yb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        AT.interpolate(ya, scale_factor=1.5).square().sum().backward()
        F.interpolate(yb, scale_factor=1.5, mode="bilinear").square().sum().backward()
        torch.testing.assert_close(ya.grad, yb.grad, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("inline", [True, False], ids=["local-sync", "local-task"])
def test_every_mode_and_mask_runs_into_pytorchs_tensors(inline, monkeypatch):
    """The custom op writes its gradients into tensors PyTorch allocated, for every mode and
    output mask, inline (local-sync) and on the task workers: the Pythonic call's bits.
    (A nearest grid gradient alone is a fill, which IREE refused on DLPack-imported memory.)"""
    from aclnn_iree.ops import grid_sampler
    for kind in grid_sampler.OPERATOR.inline_work:  # "" and each mode's
        monkeypatch.setitem(grid_sampler.OPERATOR.inline_work, kind, 10 ** 9 if inline else -1)
    rng = np.random.default_rng(5)
    x, go = rng.standard_normal((2, 3, 6, 7)), rng.standard_normal((2, 3, 4, 5))
    grid = rng.uniform(-1.2, 1.2, (2, 4, 5, 2))
    for mode, pad, mask in itertools.product((0, 1, 2), (0, 1, 2), ([True, True], [True, False], [False, True])):
        dx, dg = OPS.grid_sampler_2d_backward(torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(grid), mode,
                                              pad, False, mask)
        want = aclnn_iree.grid_sampler_2d_backward(go, x, grid, mode, pad, False, tuple(mask))
        for got, ref, m in zip((dx, dg), want, mask):
            if m:
                assert got.numpy().tobytes() == ref.tobytes(), (mode, pad, mask)
            else:
                assert got.numel() == 0


def test_no_copies_of_contiguous_tensors_on_the_cpu(monkeypatch):
    """The kernels read the caller's tensors and write the returned gradients in place: the
    device buffers the aclnn layer gets map onto the tensors' own memory (DLPack for
    PyTorch's 64-byte aligned allocations, a NumPy view for other aligned memory)."""
    seen = []
    real = _bridge._storage

    def spy(device, t, fmt="ND", output=False):
        s = real(device, t, fmt, output)
        nbytes = t.numel() * t.element_size()
        mapped = s.buffer.map().asarray([nbytes], np.dtype(np.uint8)).ctypes.data
        seen.append((t.data_ptr(), mapped))
        return s

    monkeypatch.setattr(_bridge, "_storage", spy)
    for dtype in (torch.float32, torch.bfloat16):
        seen.clear()
        go, x, grid = torch.randn(2, 3, 4, 5, dtype=dtype), torch.randn(2, 3, 6, 6, dtype=dtype), \
            (torch.rand(2, 4, 5, 2) * 2 - 1).to(dtype)
        dx, dg = OPS.grid_sampler_2d_backward(go, x, grid, 0, 0, False, [True, True])
        assert [p for p, _ in seen] == [go.data_ptr(), x.data_ptr(), grid.data_ptr(), dx.data_ptr(), dg.data_ptr()]
        assert all(p == m for p, m in seen), seen
        seen.clear()
        gu = torch.randn(2, 3, 8, 10, dtype=dtype).contiguous(memory_format=torch.channels_last)
        du = OPS.upsample_bilinear2d_backward(gu, [8, 10], [2, 3, 4, 5], False, None, None)
        assert du.is_contiguous(memory_format=torch.channels_last)
        assert seen == [(gu.data_ptr(), gu.data_ptr()), (du.data_ptr(), du.data_ptr())]
    seen.clear()
    from aclnn_iree.core.tensors import empty_aligned
    raw = empty_aligned((2 * 3 * 6 * 6 + 4,), np.float32)  # on a 64-byte line ...
    raw[...] = 1
    off16 = torch.from_numpy(raw[4:].reshape(2, 3, 6, 6))  # ... so this starts 16 bytes past one
    assert off16.data_ptr() % 64 == 16
    OPS.grid_sampler_2d_backward(torch.ones(2, 3, 4, 5), off16, torch.zeros(2, 4, 5, 2), 0, 0, False, [True, False])
    assert (off16.data_ptr(), off16.data_ptr()) in seen  # the NumPy-view import: still no copy


def test_vulkan_for_cpu_tensors():
    """set_cpu_device("vulkan"): CPU tensors computed on Vulkan (copied there and back), with
    the Vulkan kernels' bits."""
    require_device("vulkan")
    x, g, go = torch.randn(1, 2, 6, 6), torch.rand(1, 4, 4, 2) * 2 - 1, torch.randn(1, 2, 4, 4)
    AT.set_cpu_device("vulkan")
    try:
        dx, dg = OPS.grid_sampler_2d_backward(go, x, g, 0, 1, False, [True, True])
    finally:
        AT.set_cpu_device("local-task")
    want = aclnn_iree.grid_sampler_2d_backward(go.numpy(), x.numpy(), g.numpy(), 0, 1, False, device="vulkan")
    _assert_bits(dx, want[0], "vulkan grad_input")
    _assert_bits(dg, want[1], "vulkan grad_grid")


@pytest.mark.parametrize("in_size", [(1, 4, 4, 4), (2, 3, 5, 6)], ids=["C=H=W", "C!=H!=W"])
def test_vulkan_for_channels_last_cpu_tensors(in_size):
    """A channels_last upsample backward of CPU tensors on Vulkan: the NHWC kernel's result,
    read back from device memory, lands in the channels_last gradient in its own layout (it
    was once copied in as if NCHW: scrambled axes where C = H = W, a ValueError elsewhere),
    with the Vulkan kernel's bits, within float32's bound of PyTorch's own gradient."""
    from test_aclnn import assert_close
    require_device("vulkan")
    N, C, H, W = in_size
    go = torch.randn(N, C, 2 * H + 1, 2 * W - 1).contiguous(memory_format=torch.channels_last)
    osz = list(go.shape[2:])
    AT.set_cpu_device("vulkan")
    try:
        dx = OPS.upsample_bilinear2d_backward(go, osz, list(in_size), False, None, None)
    finally:
        AT.set_cpu_device("local-task")
    assert dx.is_contiguous(memory_format=torch.channels_last)
    want = aclnn_iree.upsample_bilinear2d_backward(go.permute(0, 2, 3, 1).numpy(), osz, [N, H, W, C], False,
                                                   memory_format="NHWC", device="vulkan")
    _assert_bits(dx.permute(0, 2, 3, 1), want, "vulkan channels_last grad_input")
    ref = torch.ops.aten.upsample_bilinear2d_backward(go.double(), osz, list(in_size), False)
    assert_close(dx.numpy(), ref.numpy(), np.float32)


def test_bad_arguments_are_clear_errors():
    x = torch.randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match="mode='bilinear' only"):
        AT.interpolate(x, scale_factor=2, mode="bicubic")
    with pytest.raises(ValueError, match="expected mode"):
        AT.grid_sample(x, torch.zeros(1, 2, 2, 2), mode="cubic")
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        AT.interpolate(x, size=3, scale_factor=2)
    with pytest.raises(ValueError, match="not supported"):
        OPS.grid_sampler_2d_backward(torch.ones(1, 2, 2, 2, dtype=torch.int32), x.int(), torch.zeros(1, 2, 2, 2).int(),
                                     0, 0, False, [True, True])
    with pytest.raises(aclnn_iree.AclnnError) as ei:  # aclnn's shape check, with PyTorch's names
        OPS.grid_sampler_2d_backward(torch.ones(1, 2, 3, 3), x, torch.zeros(1, 2, 2, 2), 0, 0, False, [True, True])
    assert ei.value.status == 161002 and "grad_output" in str(ei.value)


def test_argument_types_are_refused_as_pytorch_refuses_them():
    """The functions take what F.grid_sample / F.interpolate take, and raise their error type
    (with PyTorch's words for the overflow) for what they refuse."""
    x, g = torch.randn(1, 1, 4, 4), torch.zeros(1, 2, 2, 2)
    for bad in ("yes", 1, np.bool_(True)):
        for f in (lambda: AT.grid_sample(x, g, align_corners=bad), lambda: F.grid_sample(x, g, align_corners=bad),
                  lambda: AT.interpolate(x, scale_factor=2, align_corners=bad),
                  lambda: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=bad)):
            with pytest.raises(TypeError):
                f()
    for bad in (torch.tensor(2.0), "2", (2.0, "2")):
        for f in (AT.interpolate, lambda a, **k: F.interpolate(a, mode="bilinear", **k)):
            with pytest.raises(TypeError):
                f(x, scale_factor=bad)
    for bad in (float("nan"), float("inf"), 1e30):
        for f in (AT.interpolate, lambda a, **k: F.interpolate(a, mode="bilinear", **k)):
            with pytest.raises(RuntimeError, match="int64_t without overflow"):
                f(x, scale_factor=bad)
    for ok in (np.float32(2.0), 2, (2, 1.5)):  # what F.interpolate takes, with its output shape
        assert AT.interpolate(x, scale_factor=ok).shape == F.interpolate(x, scale_factor=ok, mode="bilinear").shape
    assert AT.grid_sample(x, g, align_corners=None).shape == (1, 1, 2, 2)


def test_importing_aclnn_iree_needs_no_torch():
    code = """
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        import numpy as np, aclnn_iree, aclnn_iree.aclnn
        dx, dg = aclnn_iree.grid_sampler_2d_backward(np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 3, 3), np.float32),
                                                    np.zeros((1, 2, 2, 2), np.float32))
        assert dx.sum() == 4.0
        try:
            import aclnn_iree.torch
        except ImportError:
            print("OK")
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "OK", p.stderr


def test_a_process_using_the_torch_layer_exits_quietly():
    """No report of leaked IREE objects at exit (nanobind printed ~160 lines after every process
    that ran the torch layer: runtime.kernels releases the modules and devices at exit)."""
    code = """
        import torch, aclnn_iree.torch as AT
        x = torch.randn(1, 2, 5, 5, requires_grad=True)
        grid = torch.rand(1, 3, 3, 2) * 2 - 1
        AT.grid_sample(AT.interpolate(x, scale_factor=2.0), grid).sum().backward()
        with AT.enabled():
            torch.nn.functional.interpolate(x, size=(7, 7), mode="bilinear").sum().backward()
        print("OK")
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "OK", p.stderr
    assert "leaked" not in p.stderr, p.stderr[:2000]


# ----------------------------------------------------------------------------- enabled()
def _unmodified_backward(x, grid, z):
    xa, ga, za = x.clone().requires_grad_(True), grid.clone().requires_grad_(True), z.clone().requires_grad_(True)
    (F.grid_sample(xa, ga, padding_mode="reflection", align_corners=False).square().sum()
     + F.interpolate(za, scale_factor=2.0, mode="bilinear").square().sum()).backward()
    return xa.grad, ga.grad, za.grad


def _ours(x, grid, z):
    """Our kernels on the same gradients (d(sum y^2)/dy = 2y) through the Pythonic layer."""
    y = F.grid_sample(x, grid, padding_mode="reflection", align_corners=False)
    dx, dg = aclnn_iree.grid_sampler_2d_backward((2 * y).numpy(), x.numpy(), grid.numpy(), 0, 2, False)
    u = F.interpolate(z, scale_factor=2.0, mode="bilinear")
    dz = aclnn_iree.upsample_bilinear2d_backward((2 * u).numpy(), u.shape[2:], z.shape, False, 2.0, 2.0)
    return dx, dg, dz


def _bits(t):
    return t.numpy().tobytes()


def test_enabled_makes_unmodified_models_use_our_kernels_and_restores_pytorch():
    g = torch.Generator().manual_seed(7)
    x, grid, z = torch.randn(2, 3, 7, 6, generator=g), torch.rand(2, 5, 4, 2, generator=g) * 3 - 1.5, \
        torch.randn(2, 3, 5, 6, generator=g)
    pytorch_bits = [_bits(t) for t in _unmodified_backward(x, grid, z)]
    ours_bits = [np.ascontiguousarray(a).tobytes() for a in _ours(x, grid, z)]
    assert pytorch_bits != ours_bits  # distinguishable (the two sum in different orders)
    with AT.enabled():
        assert AT.is_enabled()
        assert [_bits(t) for t in _unmodified_backward(x, grid, z)] == ours_bits
        with AT.enabled():  # nesting keeps it on
            pass
        assert AT.is_enabled()
        assert [_bits(t) for t in _unmodified_backward(x, grid, z)] == ours_bits
    assert not AT.is_enabled()
    assert [_bits(t) for t in _unmodified_backward(x, grid, z)] == pytorch_bits
    with pytest.raises(KeyError):
        with AT.enabled():
            raise KeyError("inside")
    assert not AT.is_enabled() and [_bits(t) for t in _unmodified_backward(x, grid, z)] == pytorch_bits
    AT.enable()
    AT.enable()
    try:
        assert [_bits(t) for t in _unmodified_backward(x, grid, z)] == ours_bits
    finally:
        AT.disable()
    assert [_bits(t) for t in _unmodified_backward(x, grid, z)] == pytorch_bits


def test_enabled_runs_our_forward_kernels_and_restores_pytorchs(monkeypatch):
    """Under enabled(), F.grid_sample's and F.interpolate's forwards (aten::grid_sampler_2d, and
    aten::upsample_bilinear2d.vec, which decomposes into aten::upsample_bilinear2d) run our
    kernels (counted) and give their bits; outside, PyTorch's own run again."""
    from aclnn_iree.torch import grid_sampler as tgs, upsample as tup
    ran = []
    for module, fn in ((tgs, "grid_sampler_forward"), (tup, "upsample_forward")):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, real=real, fn=fn: ran.append(fn) or real(*a))
    g = torch.Generator().manual_seed(11)
    x, grid = torch.randn(2, 3, 9, 7, generator=g), torch.rand(2, 5, 4, 2, generator=g) * 2.4 - 1.2
    cases = {"grid_sample": (lambda: F.grid_sample(x, grid, mode="bicubic", padding_mode="reflection",
                                                   align_corners=False),
                             lambda: aclnn_iree.grid_sampler_2d(x.numpy(), grid.numpy(), 2, 2, False)),
             "interpolate": (lambda: F.interpolate(x, scale_factor=1.7, mode="bilinear", align_corners=True),
                             lambda: aclnn_iree.upsample_bilinear2d(x.numpy(), (15, 11), True, 1.7, 1.7))}
    for name, (pytorch_call, ours) in cases.items():
        before = _bits(pytorch_call())
        assert not ran
        with AT.enabled():
            inside = _bits(pytorch_call())
        assert len(ran) == 1, (name, ran)
        assert inside == np.ascontiguousarray(ours()).tobytes(), name
        assert _bits(pytorch_call()) == before and len(ran) == 1, name
        ran.clear()


def test_enabled_blocks_in_two_threads_count_as_one():
    """A enters, B enters, A leaves: B, still inside its block, keeps our kernels (the
    registry is process-wide); the state before the first block comes back after the last."""
    import threading
    a_in, b_in, a_out, b_checked = (threading.Event() for _ in range(4))
    seen = {}

    def thread_a():
        with AT.enabled():
            a_in.set()
            b_in.wait(60)
        a_out.set()

    def thread_b():
        a_in.wait(60)
        with AT.enabled():
            b_in.set()
            a_out.wait(60)
            seen["b_inside_after_a_left"] = AT.is_enabled()
        b_checked.set()

    threads = [threading.Thread(target=f) for f in (thread_a, thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert b_checked.is_set() and seen == {"b_inside_after_a_left": True}
    assert not AT.is_enabled()


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_enabled_leaves_a_non_finite_upsample_scale_to_pytorch(scale):
    """PyTorch accepts a NaN or infinite scale (and ignores it for the sizes given); aclnn takes
    none: under enabled() both aten ops run PyTorch's kernel for it (it raised ValueError)."""
    x, go = torch.randn(1, 1, 3, 3), torch.randn(1, 1, 6, 6)
    want = (torch.ops.aten.upsample_bilinear2d(x, [6, 6], False, scale, None),
            torch.ops.aten.upsample_bilinear2d_backward(go, [6, 6], [1, 1, 3, 3], False, scale, None))
    with AT.enabled():
        got = (torch.ops.aten.upsample_bilinear2d(x, [6, 6], False, scale, None),
               torch.ops.aten.upsample_bilinear2d_backward(go, [6, 6], [1, 1, 3, 3], False, scale, None))
    for a, b in zip(got, want):
        assert _bits(a) == _bits(b)


def test_enabled_keeps_pytorch_for_what_we_do_not_handle():
    """Integer grids never reach a backward; an upsample scale that disagrees with the sizes
    (PyTorch defines it, aclnn refuses it) goes to PyTorch's kernel."""
    go = torch.randn(1, 1, 6, 6)
    want = torch.ops.aten.upsample_bilinear2d_backward(go, [6, 6], [1, 1, 3, 3], False, 1.7, 1.7)
    with AT.enabled():
        got = torch.ops.aten.upsample_bilinear2d_backward(go, [6, 6], [1, 1, 3, 3], False, 1.7, 1.7)
    assert _bits(got) == _bits(want)


# ----------------------------------------------------------------------------- torch.compile
class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(1, 3, 1, 1, generator=g))
        self.offset = torch.nn.Parameter(torch.zeros(1, 1, 1, 2))

    def forward(self, x, grid):
        y = AT.interpolate(x * self.w, scale_factor=2.0)
        return AT.grid_sample(y, grid + self.offset, padding_mode="border").square().mean()


def test_torch_compile_fullgraph_has_no_graph_breaks_and_our_ops_in_both_graphs():
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func
    torch._dynamo.reset()
    x, grid = torch.randn(2, 3, 6, 6), torch.rand(2, 5, 5, 2) * 2 - 1
    m = _Model()
    assert torch._dynamo.explain(m)(x, grid).graph_break_count == 0
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    mc = torch.compile(m, backend=aot_autograd(fw_compiler=record, bw_compiler=record), fullgraph=True)
    mc(x, grid).backward()
    forward_targets = {str(n.target) for n in graphs[0].graph.nodes}
    backward_targets = {str(n.target) for n in graphs[-1].graph.nodes}
    assert {"aclnn_iree.grid_sampler_2d.default", "aclnn_iree.upsample_bilinear2d.default"} <= forward_targets
    assert {"aclnn_iree.grid_sampler_2d_backward.default",
            "aclnn_iree.upsample_bilinear2d_backward.default"} <= backward_targets


def test_torch_compile_inductor_gives_eager_gradients():
    torch._dynamo.reset()
    x, grid = torch.randn(2, 3, 6, 6), torch.rand(2, 5, 5, 2) * 2 - 1
    eager, compiled = _Model(), _Model()
    eager(x, grid).backward()
    torch.compile(compiled, fullgraph=True)(x, grid).backward()
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- DDP
_DDP = """
    import os, sys
    import torch, torch.distributed as dist
    import aclnn_iree.torch as AT
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    grid = torch.rand(4, 5, 5, 2, dtype=torch.float64) * 2.2 - 1.1

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64).reshape(1, 3, 1, 1))
            self.offset = torch.nn.Parameter(torch.full((1, 1, 1, 2), 0.05, dtype=torch.float64))
        def forward(self, x, grid):
            y = AT.interpolate(x * self.w, scale_factor=1.5, align_corners=True)
            return AT.grid_sample(y, grid + self.offset, padding_mode="reflection").square().mean()

    m = M()
    if world == 1:
        m(x, grid).backward()
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ddp = torch.nn.parallel.DistributedDataParallel(m)
        half = slice(2 * rank, 2 * rank + 2)
        ddp(x[half], grid[half]).backward()
        dist.destroy_process_group()
    torch.save([p.grad for p in m.parameters()], out)
    if world > 1:
        # Skip interpreter finalization: a gloo worker thread that still holds a finished
        # allreduce (whose captured autograd state holds a Python object) when it begins
        # aborts the process ("terminate called without an active exception"), a PyTorch
        # race (pytorch/pytorch#190489, #179291); DDP keeps the process group alive past
        # destroy_process_group, so its threads cannot be joined first.
        os._exit(0)
"""


def test_distributed_data_parallel_gloo_two_processes(tmp_path):
    """DDP averages the two halves' gradients: equal (to float64 rounding) to one process
    over the whole batch."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    code = textwrap.dedent(_DDP)
    run = lambda rank, world, out: subprocess.Popen(  # noqa: E731
        [sys.executable, "-c", code, str(rank), str(world), port, str(out)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    procs = [run(r, 2, tmp_path / f"ddp{r}.pt") for r in range(2)] + [run(0, 1, tmp_path / "one.pt")]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    one = torch.load(tmp_path / "one.pt")
    for r in range(2):
        for a, b in zip(torch.load(tmp_path / f"ddp{r}.pt"), one):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- CUDA (scripts/gpu_check.sh)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="this PyTorch sees no CUDA device")


@needs_cuda
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=lambda d: d.name)
def test_cuda_tensors_run_on_iree_cuda_without_copies(dtype, monkeypatch):
    """CUDA tensors go to IREE's cuda device through DLPack: gradients within the dtype's
    bound of the reference and of PyTorch's CUDA autograd, written into the returned
    tensors' own memory."""
    require_device("cuda")
    imported = []
    real = _bridge._storage
    monkeypatch.setattr(_bridge, "_storage",
                        lambda dev, t, fmt="ND", output=False: imported.append(t.data_ptr()) or real(dev, t, fmt, output))
    case = grid_case(0, 1, False, "random")
    go, x, grid = case.inputs(dtype)
    xt, gt = (_t(a, dtype).cuda().requires_grad_(True) for a in (x, grid))
    AT.grid_sample(xt, gt, padding_mode="border").backward(_t(go, dtype).cuda())
    assert xt.grad.data_ptr() in imported and gt.grad.data_ptr() in imported
    xr, gr = (_t(a, dtype).cuda().requires_grad_(True) for a in (x, grid))
    F.grid_sample(xr, gr, padding_mode="border", align_corners=False).backward(_t(go, dtype).cuda())
    refs, sums = case.reference(dtype), case.abs_sums(dtype)
    _check_bound(xt.grad.cpu(), refs["dx"], sums["dx"], dtype, xr.grad.cpu(), f"cuda {dtype.name} dx")
    _check_bound(gt.grad.cpu(), refs["dgrid"], sums["dgrid"], dtype, gr.grad.cpu(), f"cuda {dtype.name} dgrid")
    ucase = upsample_case("up", "random", False, "NHWC")
    (ugo,) = ucase.inputs(dtype)
    (Ho, Wo), (N, C, H, W) = ucase.sizes
    u = torch.zeros((N, C, H, W), dtype=_torch_dtype(dtype), device="cuda").contiguous(
        memory_format=torch.channels_last).requires_grad_(True)
    AT.interpolate(u, size=(Ho, Wo)).backward(_t(ugo, dtype).cuda().contiguous(memory_format=torch.channels_last))
    ur = torch.zeros_like(u).requires_grad_(True)
    F.interpolate(ur, size=(Ho, Wo), mode="bilinear").backward(
        _t(ugo, dtype).cuda().contiguous(memory_format=torch.channels_last))
    _check_bound(u.grad.cpu(), ucase.reference(dtype)["dx"], ucase.abs_sums(dtype)["dx"], dtype, ur.grad.cpu(),
                 f"cuda {dtype.name} upsample")


def _count_stream_launches(monkeypatch):
    """The names of the kernels launched on PyTorch's stream from now on (runtime.cuda)."""
    from aclnn_iree.runtime import cuda
    launched, real = [], cuda.Executable.launch
    monkeypatch.setattr(cuda.Executable, "launch", lambda self, name, *a: launched.append(name) or real(self, name, *a))
    return launched


@needs_cuda
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=lambda d: d.name)
def test_cuda_stream_launch_gives_the_iree_launchs_results(dtype, monkeypatch):
    """ACLNN_IREE_CUDA_LAUNCH=stream: after a signature's first call, the forwards and the grid
    backward (both gradients in one pass, each alone in the two-pass form's dispatches) launch on
    PyTorch's current stream (a side stream here, never synchronised by us): the same bits as
    IREE's launch of the same kernels, except grad_input's atomic sums, which are within the
    dtype's bound of the reference."""
    require_device("cuda")
    launched = _count_stream_launches(monkeypatch)
    case = grid_case(0, 1, False, "random")
    go, x, grid = case.inputs(dtype)
    ucase = upsample_case("up", "random", False, "NHWC")
    (Ho, Wo), (N, C, H, W) = ucase.sizes
    u = torch.from_numpy(np.random.default_rng(3).standard_normal((N, C, H, W))).to(_torch_dtype(dtype))

    def step():
        xt, gt = (_t(a, dtype).cuda().requires_grad_(True) for a in (x, grid))
        gout = _t(go, dtype).cuda()
        out = AT.grid_sample(xt, gt, padding_mode="border")
        out.backward(gout)  # both gradients: CUDA's one pass (<kernel>_points)
        (dx_only,) = torch.autograd.grad(AT.grid_sample(xt, gt.detach(), padding_mode="border"), xt, gout)
        (dgrid_only,) = torch.autograd.grad(AT.grid_sample(xt.detach(), gt, padding_mode="border"), gt, gout)
        up = AT.interpolate(u.cuda().contiguous(memory_format=torch.channels_last), size=(Ho, Wo))
        return [t.detach().cpu() for t in (out, xt.grad, gt.grad, up, dx_only, dgrid_only)]

    monkeypatch.setenv("ACLNN_IREE_CUDA_LAUNCH", "iree")
    iree = step()
    assert launched == []
    monkeypatch.setenv("ACLNN_IREE_CUDA_LAUNCH", "stream")
    step()  # the signatures' first calls: IREE's runtime, then their plans
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        streamed = step()
    assert {"sample_gpu", "dx_dgrid_points", "dx_atomic", "dgrid_points_gpu", "upsample"} <= set(launched)
    for i, what in ((0, "output"), (2, "grad_grid"), (3, "upsampled"), (5, "grad_grid alone")):
        assert torch.equal(streamed[i].view(torch.int16) if dtype == BF16 else streamed[i],
                           iree[i].view(torch.int16) if dtype == BF16 else iree[i]), what
    assert torch.equal(streamed[2], streamed[5]), "one pass and grad_grid alone: the same bits"
    for i in (1, 4):  # atomic sums: within the dtype's bound of the reference
        _check_bound(streamed[i], case.reference(dtype)["dx"], case.abs_sums(dtype)["dx"], dtype, iree[i],
                     f"stream launch {dtype.name} dx")


@needs_cuda
def test_cuda_stream_launch_is_captured_by_a_cuda_graph(monkeypatch):
    """With the stream launch, a warmed-up grid_sample is captured by torch.cuda.graph and its
    replay computes on the inputs' new values (nothing synchronises inside the capture)."""
    require_device("cuda")
    monkeypatch.setenv("ACLNN_IREE_CUDA_LAUNCH", "stream")
    launched = _count_stream_launches(monkeypatch)
    x = torch.randn(2, 3, 16, 16, device="cuda")
    grid = torch.rand(2, 8, 8, 2, device="cuda") * 2 - 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # the first call on IREE's runtime leaves the plan the others launch
            AT.grid_sample(x, grid)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = AT.grid_sample(x, grid)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert launched.count("sample_gpu") >= 3
    assert torch.equal(y, AT.grid_sample(x, grid))


@needs_cuda
def test_cuda_falls_back_to_pytorch_with_one_warning_when_iree_has_no_cuda(monkeypatch):
    from aclnn_iree.runtime.device import DeviceUnavailable

    def no_cuda(name="local-task"):
        raise DeviceUnavailable("IREE device 'cuda' is not available: test")

    monkeypatch.setattr(_bridge, "get_device", no_cuda)
    monkeypatch.setattr(_bridge, "_warned", set())
    x = torch.randn(1, 2, 5, 5, device="cuda", requires_grad=True)
    grid = torch.rand(1, 3, 3, 2, device="cuda") * 2 - 1
    with pytest.warns(RuntimeWarning, match="PyTorch's own kernels"):
        AT.grid_sample(x, grid).sum().backward()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AT.grid_sample(x, grid).sum().backward()  # no second warning
    xr = x.detach().clone().requires_grad_(True)
    F.grid_sample(xr, grid, align_corners=False).sum().backward()
    torch.testing.assert_close(x.grad / 2, xr.grad)


def test_enabled_toggled_in_one_thread_while_another_runs_backward():
    """One thread enters and leaves enabled() as fast as it can while another runs 3,000
    plain F.grid_sample / F.interpolate backward calls: no error, no crash, and every result
    is PyTorch's bits or ours.  Before, registering and removing the aten kernels under the
    other thread's dispatch failed 1-101 calls in 3,000 (SafePyObject INTERNAL ASSERT, wrong
    argument counts) and twice in 7 runs segfaulted.  20 runs, in child processes."""
    code = """
        import threading, time
        import numpy as np, torch, torch.nn.functional as F
        import aclnn_iree.torch as AT
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(3)
        x, grid, z = torch.randn(1, 2, 6, 5, generator=g), torch.rand(1, 4, 3, 2, generator=g) * 2 - 1, \\
            torch.randn(1, 2, 4, 5, generator=g)

        def grads():
            xx, gg, zz = (t.clone().requires_grad_() for t in (x, grid, z))
            F.grid_sample(xx, gg, align_corners=False).square().sum().backward()
            F.interpolate(zz, scale_factor=2.0, mode="bilinear").square().sum().backward()
            return tuple(t.grad.numpy().tobytes() for t in (xx, gg, zz))

        pytorch = grads()
        with AT.enabled():  # the one registration, before the threads start
            ours = grads()
        assert pytorch != ours
        for run in range(10):
            stop = threading.Event()
            errors, seen = [], {"pytorch": 0, "ours": 0}

            def toggle():
                while not stop.is_set():
                    with AT.enabled():
                        pass
                    time.sleep(0)  # lets the other thread take the GIL: a spinning toggler starved it

            def backward():
                try:
                    for _ in range(1500):
                        r = grads()
                        if r == pytorch:
                            seen["pytorch"] += 1
                        elif r == ours:
                            seen["ours"] += 1
                        else:  # neither kernel's bits (grid_sample's and interpolate's may mix)
                            assert all(a in (p, o) for a, p, o in zip(r, pytorch, ours)), "foreign bits"
                except BaseException as e:
                    errors.append(repr(e))
                finally:
                    stop.set()

            threads = [threading.Thread(target=f) for f in (toggle, backward)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            assert not errors, errors
            assert not AT.is_enabled()
        print("ok")
    """
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                           timeout=600, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stdout[-2000:], p.stderr[-4000:])


def test_an_interrupt_entering_enabled_still_restores_pytorch(monkeypatch):
    """The attack: a KeyboardInterrupt after enabled() had counted its block and before the
    block began left our kernels on for good.  Now the block's end runs whatever happens."""
    import threading
    from aclnn_iree.torch import override

    class InterruptOnce:  # the override's lock, raising once as it is released on entry
        def __init__(self):
            self.lock, self.fired = threading.RLock(), False

        def __enter__(self):
            return self.lock.__enter__()

        def __exit__(self, *exc):
            self.lock.__exit__(*exc)
            if not self.fired and override._open_blocks:
                self.fired = True
                raise KeyboardInterrupt

    monkeypatch.setattr(override, "_lock", InterruptOnce())
    with pytest.raises(KeyboardInterrupt):
        with AT.enabled():
            pass
    assert override._lock.fired and not AT.is_enabled() and override._open_blocks == 0
