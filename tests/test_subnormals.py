"""Subnormal inputs, intermediates and results are kept on every device (docs/semantics.md).

IREE's CPU executors run dispatches with flush-to-zero and denormals-are-zero set (its task
workers set both when they start; local-sync's inline command buffers too), so before the
CPU dispatches saved and cleared the flush bits themselves (templates/_common.mlir.j2
fpenv_ieee) a subnormal input read as 0 and a subnormal product or result became 0:
normal-valued gradients came back 0 where PyTorch and the float64 reference give them.

The bound (derived, not tuned): with gradual underflow each floating-point operation obeys
fl(a op b) = (a op b)(1 + d) + e, |d| <= u, |e| <= tiny/2 (e = 0 for + and -; u and tiny the
compute type's unit roundoff and smallest subnormal; Higham, "Accuracy and Stability of
Numerical Algorithms", 2.1), so an output that sums n terms of at most K_TERM roundings
each is within

    gamma(n + K_TERM) * S + A + n * (K_TERM + 1) * tiny_c                     (compute)
    + 2 * max(eps_d / 2 * |ref|, tiny_d / 2)   for float16 / bfloat16 storage (final rounding)

of the float64 reference on the same rounded inputs, where S = sum |terms| and A the weights'
absolute error (both from tests/test_dtypes.py's grid_abs_sums for the grid sampler; for
the upsample S is the reference run on |grad_output|, and A = (delta_h + delta_w) * n *
max|grad_output| with delta = 4 * u * (in + 1)).  Most nonzero reference values of each case
exceed that bound (checked), so flushed elements (0, or a sum missing its subnormal terms)
fail.
PyTorch's values must lie within the same bound of the reference (its own kernels keep
subnormals), and so within twice it of ours.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from aclnn_iree.core import api
from aclnn_iree.ops import reference as ref
from conftest import DEVICES, prepare_modules, require_device
from test_dtypes import K_TERM, grid_abs_sums

torch = pytest.importorskip("torch")

F16, BF16, F32, F64 = (np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64))
DTYPES = (F32, F64, BF16, F16)
CPU_DEVICES = ("local-task", "local-sync")
ALL_DEVICES = tuple(dict.fromkeys(CPU_DEVICES + DEVICES))
TORCH_DTYPE = {F16: torch.float16, BF16: torch.bfloat16, F32: torch.float32, F64: torch.float64}


def _compute(dtype):
    return ml_dtypes.finfo(np.float64 if dtype == F64 else np.float32)


def _tiny(dtype) -> float:
    """A value that is subnormal in `dtype` (and in float32 for the half types that share its
    exponent range: bfloat16; float16's subnormals are normal numbers in float32)."""
    return float(ml_dtypes.finfo(dtype).smallest_normal) / 4


def bound(ref_out, S, n, A, dtype):
    c = _compute(dtype)
    u, tiny_c = float(c.eps) / 2, float(c.smallest_subnormal)
    k = np.asarray(n, np.float64) + K_TERM
    b = k * 2 * u / (1 - k * 2 * u) * S + A + np.asarray(n, np.float64) * (K_TERM + 1) * tiny_c
    if dtype in (F16, BF16):
        d = ml_dtypes.finfo(dtype)
        b = b + 2 * np.maximum(float(d.eps) / 2 * np.abs(ref_out), float(d.smallest_subnormal) / 2)
    return b


def check(out, ref_out, S, n, A, dtype, what):
    """|out - ref| within the bound everywhere, and the bound far below the values tested."""
    o = np.asarray(out, np.float64)
    b = bound(ref_out, S, n, A, dtype)
    # The case can fail: most of its values are above the bound, so a flushed element (0,
    # off by its whole value) is caught.
    nz = ref_out != 0
    assert nz.any() and np.mean(np.abs(ref_out[nz]) > b[nz]) >= 0.5, f"{what}: the case is too coarse"
    err = np.abs(o - ref_out)
    bad = ~(err <= b)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements off, e.g. ours "
                           f"{o[bad][:4]} ref {ref_out[bad][:4]} (bound {b[bad][:4]})")


@pytest.fixture(scope="module", params=ALL_DEVICES)
def device(request):
    require_device(request.param)
    prepare_modules(request.param)
    return request.param


# ----------------------------------------------------------------------------- grid sampler
def grid_inputs(kind, dtype, mode):
    """(grad_output, input, grid) in `dtype` where `kind` is subnormal, and the others are
    scaled so that the gradients that depend on it are normal numbers where they can be."""
    rng = np.random.default_rng(7)
    N, C, H, W, Ho, Wo = 2, 5, 6, 7, 4, 5
    t = _tiny(dtype)
    go = rng.uniform(0.5, 1.0, (N, C, Ho, Wo)) * rng.choice([-1, 1], (N, C, Ho, Wo))
    x = rng.uniform(0.5, 1.0, (N, C, H, W)) * rng.choice([-1, 1], (N, C, H, W))
    grid = rng.uniform(-0.9, 0.9, (N, Ho, Wo, 2))
    if kind == "input":  # subnormal input times a large grad_output: normal grad_grid
        x *= t
        go *= float(ml_dtypes.finfo(dtype).max) ** 0.5
    elif kind == "grad_output":  # subnormal grad_output: subnormal grad_input, tiny grad_grid
        go *= t
    elif kind == "grid":  # subnormal coordinates: sampling at the centre
        grid = rng.uniform(0.5, 1.0, (N, Ho, Wo, 2)) * t * rng.choice([-1, 1], (N, Ho, Wo, 2))
    return tuple(a.astype(dtype) for a in (go, x, grid))


# The outputs each kind makes nonzero and mostly far above the bound.  A subnormal
# grad_output's grad_grid and a subnormal grid's grad_grid are sums of terms of either sign
# close to 0 (cancellation), so the bound says little there.
GRID_OUTPUTS = {"input": ("dgrid",), "grad_output": ("dx",), "grid": ("dx",)}


@pytest.mark.parametrize("mode", [ref.INTERP_BILINEAR, ref.INTERP_NEAREST, ref.INTERP_BICUBIC],
                         ids=["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("kind", list(GRID_OUTPUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grid_sampler_keeps_subnormals(device, dtype, kind, mode):
    if mode == ref.INTERP_NEAREST and kind == "input":
        pytest.skip("nearest has no grid gradient")
    if dtype == F16 and kind == "grid":
        pytest.skip("float16's subnormal coordinates are normal float32 numbers (coordinates are float32)")
    go, x, g = grid_inputs(kind, dtype, mode)
    pad, ac = ref.PAD_ZEROS, False
    ours = dict(zip(("dx", "dgrid"), api.grid_sampler_2d_backward(go, x, g, mode, pad, ac, device=device)))
    f64 = [a.astype(np.float64) for a in (go, x, g)]
    want = dict(zip(("dx", "dgrid"), ref.grid_sampler_2d_backward(*f64, mode, pad, ac)))
    sums = grid_abs_sums(*f64, mode, pad, ac)
    theirs = torch.ops.aten.grid_sampler_2d_backward(*(torch.from_numpy(a.astype(np.float32 if dtype != F64
                                                                                 else np.float64))
                                                       .to(TORCH_DTYPE[dtype]) for a in (go, x, g)),
                                                     mode, pad, ac, [True, True])
    theirs = dict(zip(("dx", "dgrid"), (t.double().numpy() for t in theirs)))
    for name in GRID_OUTPUTS[kind]:
        S, n, A = sums[name]
        check(ours[name], want[name], S, n, A, dtype, f"{device} {dtype} {kind} {name} ours")
        if dtype not in (F16, BF16):  # PyTorch computes half types in the storage type
            check(theirs[name], want[name], S, n, A, dtype, f"{device} {dtype} {kind} {name} PyTorch")


# ----------------------------------------------------------------------------- upsample
def upsample_bound_terms(go64, in_hw, out_hw, ac, dtype):
    """(S, n, A) of each grad_input element (module docstring)."""
    N, C = go64.shape[:2]
    S = ref.upsample_bilinear2d_backward(np.abs(go64), out_hw, (N, C) + tuple(in_hw), ac)
    n = float(np.prod([-(-o // i) + 2 for i, o in zip(in_hw, out_hw)]))
    u = float(_compute(dtype).eps) / 2
    delta = sum(4 * u * (i + 1) for i in in_hw)
    A = np.full(S.shape, delta * n * float(np.max(np.abs(go64))))
    return S, n, A


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("sizes", [((16, 16), (64, 64)), ((64, 64), (16, 16)), ((9, 13), (9, 13)),
                                   ((5, 40), (21, 7))], ids=lambda s: f"{s[0]}from{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_upsample_keeps_subnormals(device, dtype, sizes, layout):
    """grad_output all subnormal (one sign, so each grad_input element sums up to 25 subnormal
    products, many of which are subnormal themselves): the sums of many subnormals."""
    (h, w), (ho, wo) = sizes
    rng = np.random.default_rng(3)
    go = (rng.uniform(0.25, 1.0, (2, 3, ho, wo)) * _tiny(dtype)).astype(dtype)
    go64 = go.astype(np.float64)
    for ac in (False, True):
        arg, size = go, (2, 3, h, w)
        if layout == "NHWC":
            arg, size = np.ascontiguousarray(go.transpose(0, 2, 3, 1)), (2, h, w, 3)
        out = api.upsample_bilinear2d_backward(arg, (ho, wo), size, ac, memory_format=layout, device=device)
        if layout == "NHWC":
            out = out.transpose(0, 3, 1, 2)
        want = ref.upsample_bilinear2d_backward(go64, (ho, wo), (2, 3, h, w), ac)
        S, n, A = upsample_bound_terms(go64, (h, w), (ho, wo), ac, dtype)
        check(out, want, S, n, A, dtype, f"{device} {dtype} ac={ac} ours")
        theirs = torch.ops.aten.upsample_bilinear2d_backward(
            torch.from_numpy(go.astype(np.float32 if dtype != F64 else np.float64)).to(TORCH_DTYPE[dtype]),
            [ho, wo], [2, 3, h, w], ac).double().numpy()
        check(theirs, want, S, n, A, dtype, f"{device} {dtype} ac={ac} PyTorch")


# ----------------------------------------------------------------------------- the torch layer
@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=str)
def test_torch_autograd_keeps_subnormals(dtype):
    """F.grid_sample and F.interpolate under aclnn_iree.torch.enabled(): our CPU kernels give
    PyTorch's subnormal-born gradients, within the bound of the float64 reference."""
    import torch.nn.functional as F
    import aclnn_iree.torch as at
    go, x, g = grid_inputs("input", dtype, ref.INTERP_BILINEAR)
    tt = TORCH_DTYPE[dtype]
    xt = torch.from_numpy(x.astype(np.float64)).to(tt)
    gt = torch.from_numpy(g.astype(np.float64)).to(tt).requires_grad_()
    with at.enabled():
        F.grid_sample(xt, gt, mode="bilinear", padding_mode="zeros", align_corners=False).backward(
            torch.from_numpy(go.astype(np.float64)).to(tt))
    f64 = [a.astype(np.float64) for a in (go, x, g)]
    _, want = ref.grid_sampler_2d_backward(*f64, 0, 0, False)
    S, n, A = grid_abs_sums(*f64, 0, 0, False)["dgrid"]
    check(gt.grad.double().numpy(), want, S, n, A, dtype, f"torch grid_sample {dtype}")

    rng = np.random.default_rng(5)
    go = (rng.uniform(0.25, 1.0, (1, 2, 64, 64)) * _tiny(dtype)).astype(dtype)
    xi = torch.zeros((1, 2, 16, 16), dtype=tt, requires_grad=True)
    with at.enabled():
        F.interpolate(xi, size=(64, 64), mode="bilinear", align_corners=False).backward(
            torch.from_numpy(go.astype(np.float64)).to(tt))
    go64 = go.astype(np.float64)
    want = ref.upsample_bilinear2d_backward(go64, (64, 64), (1, 2, 16, 16), False)
    S, n, A = upsample_bound_terms(go64, (16, 16), (64, 64), False, dtype)
    check(xi.grad.double().numpy(), want, S, n, A, dtype, f"torch interpolate {dtype}")


def test_no_floating_point_state_leaks_into_the_caller():
    """local-sync runs dispatches on the calling thread: after them the thread still computes
    with subnormals (NumPy's float32 arithmetic uses the thread's MXCSR / FPCR)."""
    require_device("local-sync")
    go = np.full((1, 1, 8, 8), 1e-39, np.float32)
    api.upsample_bilinear2d_backward(go, (8, 8), (1, 1, 4, 4), device="local-sync")
    api.grid_sampler_2d_backward(go[:, :, :2, :2], go, np.zeros((1, 2, 2, 2), np.float32), device="local-sync")
    a = np.array([3e-39], np.float32)
    assert a[0] != 0 and (a * np.float32(0.5))[0] == np.float32(1.5e-39)
