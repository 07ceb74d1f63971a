"""aclnnGridSampler2D and aclnnUpsampleBilinear2d: each check with its status, in aclnn's order,
and the Pythonic layer's errors.  (Their numbers: tests/grid_sampler_2d/, tests/upsample_bilinear2d/.)"""
from __future__ import annotations

import numpy as np
import pytest

from aclnn_iree import aclnn as A
from aclnn_iree.core import api
from aclnn_iree.core.errors import AclnnError

SUCCESS, NULLPTR, INVALID = A.ACLNN_SUCCESS, A.ACLNN_ERR_PARAM_NULLPTR, A.ACLNN_ERR_PARAM_INVALID


def _status(result, expected, match=None):
    status = result[0] if isinstance(result, tuple) else result
    msg = A.aclGetRecentErrMsg()
    assert status == expected, msg
    if match:
        assert match in msg, msg
    return msg


# ----------------------------------------------------------------------------- grid sampler
def gs_tensors(N=2, C=3, H=4, W=5, Ho=3, Wo=4, dtype=np.float32, out_shape=None, fmt="ND"):
    rng = np.random.default_rng(0)
    x = A.aclCreateTensor(rng.standard_normal((N, C, H, W)).astype(dtype), fmt)
    g = A.aclCreateTensor(rng.uniform(-1, 1, (N, Ho, Wo, 2)).astype(dtype))
    out = A.aclCreateTensor(shape=out_shape or (N, C, Ho, Wo), dtype=dtype)
    return x, g, out


def gs(x, g, out, mode=0, pad=0, ac=False):
    return A.aclnnGridSampler2DGetWorkspaceSize(x, g, mode, pad, ac, out)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_grid_sampler_none_or_destroyed_tensor_is_nullptr(which):
    t = list(gs_tensors())
    names = ("input", "grid", "out")
    t2 = list(t)
    t2[which] = None
    _status(gs(*t2), NULLPTR, names[which])
    A.aclDestroyTensor(t[which])
    _status(gs(*t), NULLPTR, names[which])


def test_grid_sampler_checks_in_order():
    """A None tensor is reported before an invalid mode, a bad mode before a bad shape."""
    x, g, out = gs_tensors(out_shape=(1, 1, 1, 1))
    _status(gs(x, None, out, mode=7), NULLPTR, "grid")
    _status(gs(x, g, out, mode=7), INVALID, "interpolationMode")
    _status(gs(x, g, out, pad=-1), INVALID, "paddingMode")
    _status(gs(x, g, out, ac=1), INVALID, "alignCorners")
    _status(gs(x, g, out), INVALID, "out has shape")


@pytest.mark.parametrize("kw,match", [
    (dict(dtype=np.int32), "dtype"),
    (dict(H=0), "non-zero"),
    (dict(out_shape=(2, 3, 4, 3)), "out has shape"),
    (dict(fmt="NHWC"), "NHWC"),
])
def test_grid_sampler_invalid_arguments(kw, match):
    _status(gs(*gs_tensors(**kw)), INVALID, match)


def test_grid_sampler_grid_shape_and_dtypes():
    x, _, out = gs_tensors()
    _status(gs(x, A.aclCreateTensor(np.zeros((3, 3, 4, 2), np.float32)), out), INVALID, "grid has N=3")
    _status(gs(x, A.aclCreateTensor(np.zeros((2, 3, 4, 3), np.float32)), out), INVALID, "last dimension")
    _status(gs(x, A.aclCreateTensor(np.zeros((2, 3, 4, 2), np.float64)), out), INVALID, "dtype")
    _status(gs(x, A.aclCreateTensor(np.zeros((2, 3, 4), np.float32)), out), INVALID, "4")


def test_grid_sampler_different_devices():
    x, g, out = gs_tensors()
    _, stream = A.aclrtCreateStream("local-sync")
    g2 = A.aclCreateTensor(np.zeros((2, 3, 4, 2), np.float32), stream=stream)
    _status(gs(x, g2, out), INVALID, "device")


def test_grid_sampler_empty_output_needs_no_kernel():
    x, g, out = gs_tensors(N=0)
    status, ws, ex = gs(x, g, out)
    assert status == SUCCESS and ws == 0 and ex.kernel is None, A.aclGetRecentErrMsg()


def test_grid_sampler_pythonic_errors():
    x = np.zeros((1, 1, 3, 3), np.float32)
    g = np.zeros((1, 2, 2, 2), np.float32)
    with pytest.raises(AclnnError, match="interpolation_mode 'linear' is not one of"):
        api.grid_sampler_2d(x, g, "linear")
    with pytest.raises(AclnnError, match="input is None"):
        api.grid_sampler_2d(None, g)
    with pytest.raises(AclnnError, match="grid's last dimension"):
        api.grid_sampler_2d(x, np.zeros((1, 2, 2, 3), np.float32))
    with pytest.raises(AclnnError, match="align_corners"):  # the Pythonic layer speaks PyTorch's names
        api.grid_sampler_2d(x, g, align_corners=2)


# ----------------------------------------------------------------------------- upsample
def up_tensors(N=2, C=3, H=3, W=4, Ho=5, Wo=7, dtype=np.float32, fmt="NCHW", out_shape=None):
    shape = (N, H, W, C) if fmt == "NHWC" else (N, C, H, W)
    x = A.aclCreateTensor(np.ones(shape, dtype), fmt)
    oshape = out_shape or ((N, Ho, Wo, C) if fmt == "NHWC" else (N, C, Ho, Wo))
    out = A.aclCreateTensor(shape=oshape, dtype=dtype, format=fmt)
    return x, A.aclCreateIntArray([Ho, Wo]), out


def up(x, osz, out, ac=False, sh=-1.0, sw=-1.0):
    return A.aclnnUpsampleBilinear2dGetWorkspaceSize(x, osz, ac, sh, sw, out)


def test_upsample_none_and_destroyed_arguments_are_nullptr():
    x, osz, out = up_tensors()
    _status(up(None, osz, out), NULLPTR, "self")
    _status(up(x, None, out), NULLPTR, "outputSize")
    _status(up(x, osz, None), NULLPTR, "out")
    A.aclDestroyIntArray(osz)
    _status(up(x, osz, out), NULLPTR, "outputSize")


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_upsample_invalid_arguments(fmt):
    x, osz, out = up_tensors(fmt=fmt)
    _status(up(x, [5, 7], out), INVALID, "aclIntArray")
    _status(up(x, A.aclCreateIntArray([5, 7, 1]), out), INVALID, "2 entries")
    _status(up(x, A.aclCreateIntArray([0, 7]), out), INVALID, "outputSize must be > 0")
    _status(up(x, osz, out, ac=1), INVALID, "alignCorners")
    _status(up(x, osz, out, sh=2.0), INVALID, "scalesH=2.0 is inconsistent")
    _status(up(x, osz, out, sw=float("nan")), INVALID, "scalesW")
    _status(up(*up_tensors(fmt=fmt, out_shape=(2, 3, 5, 6))), INVALID, "out has shape")
    _status(up(*up_tensors(fmt=fmt, dtype=np.int32)), INVALID, "dtype")
    _status(up(*up_tensors(fmt=fmt, H=0)), INVALID, "H and W must be > 0")


def test_upsample_formats():
    x, osz, _ = up_tensors()
    out = A.aclCreateTensor(shape=(2, 5, 7, 3), dtype=np.float32, format="NHWC")
    _status(up(x, osz, out), INVALID, "format")
    nd = A.aclCreateTensor(np.ones((2, 3, 3, 4), np.float32), "ND")
    _status(up(nd, osz, up_tensors()[2]), INVALID, "format")


def test_upsample_consistent_scale_is_accepted_by_phase1_checks():
    """A given scale that agrees with the sizes passes the checks (5 == floor(3 * 5/3))."""
    from aclnn_iree.ops import upsample_forward
    x, osz, out = up_tensors()
    layout, scales = upsample_forward.check(x, osz, False, 5 / 3, 7 / 4, out)
    assert layout == "NCHW" and scales == pytest.approx((3 / 5, 4 / 7), rel=1e-6)


def test_upsample_empty_output_needs_no_kernel():
    x, osz, out = up_tensors(N=0)
    status, ws, ex = up(x, osz, out)
    assert status == SUCCESS and ws == 0 and ex.kernel is None, A.aclGetRecentErrMsg()


def test_upsample_pythonic_errors():
    x = np.zeros((1, 1, 3, 3), np.float32)
    with pytest.raises(AclnnError, match="output_size is None"):
        api.upsample_bilinear2d(x, None)
    with pytest.raises(AclnnError, match="memory_format"):
        api.upsample_bilinear2d(x, (4, 4), memory_format="NDHWC")
    with pytest.raises(AclnnError, match="output_size must be > 0"):
        api.upsample_bilinear2d(x, (0, 4))
    with pytest.raises(AclnnError, match="scales_h=1.0 is inconsistent"):
        api.upsample_bilinear2d(x, (6, 6), scales_h=1.0)


# ----------------------------------------------------------------------------- CPU gathers
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_the_grid_sampler_uses_avx2_gathers_only_where_the_cpu_has_them(backward):
    """x86's AVX2 gather instructions load the taps (the forward's; the backward's point-parallel
    grid gradient's) where the target CPU has them (iree-compile fails on them for an older
    CPU): a named CPU without AVX2 gets vector.gather."""
    from aclnn_iree.compiler.render import render
    from aclnn_iree.compiler.specs import GridSampler2dSpec, GridSamplerSpec
    from aclnn_iree.compiler.targets import cpu_gathers, cpu_isa, get_target
    spec = (GridSamplerSpec if backward else GridSampler2dSpec)("bilinear", "zeros", False, "float32")
    old, new = get_target("llvm-cpu", "x86-64-v2"), get_target("llvm-cpu", "x86-64-v3")
    assert "llvm.x86.avx2.gather" not in render(spec, old)
    if cpu_isa() == "x86":
        assert "llvm.x86.avx2.gather" in render(spec, new)
        assert not cpu_gathers(old) and cpu_gathers(new)


# ----------------------------------------------------------------------------- rebinding
def test_rebinding_an_output_onto_an_input_is_refused_and_keeps_the_old_binding():
    """aclSetOutputTensorAddr over an input's memory is what phase 1 refuses (161002), not a
    silently wrong result; the executor keeps its previous memory and still runs."""
    import aclnn_iree
    _, s = A.aclrtCreateStream("local-sync")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    g = rng.uniform(-1, 1, (1, 6, 6, 2)).astype(np.float32)
    ti, tg = A.aclCreateTensor(x, stream=s), A.aclCreateTensor(g, stream=s)
    to = A.aclCreateTensor(shape=x.shape, dtype=np.float32, stream=s)
    status, ws, ex = A.aclnnGridSampler2DGetWorkspaceSize(ti, tg, 2, 0, False, to)
    assert status == SUCCESS and A.aclSetAclOpExecutorRepeatable(ex) == SUCCESS
    buf = np.empty(x.size + 64, np.float32)
    start = (-buf.ctypes.data % 64) // 4
    shared = buf[start:start + x.size].reshape(x.shape)
    shared[...] = x
    assert A.aclSetInputTensorAddr(ex, 0, ti, shared) == SUCCESS
    _status(A.aclSetOutputTensorAddr(ex, 0, to, shared), INVALID, "output 0 shares memory with input 0")
    later = buf[start + 16:start + 16 + x.size].reshape(x.shape)  # overlapping, 64 bytes further
    _status(A.aclSetOutputTensorAddr(ex, 0, to, later), INVALID, "output 0 shares memory with input 0")
    assert A.aclnnGridSampler2D(None, 0, ex, s) == SUCCESS and A.aclrtSynchronizeStream(s) == SUCCESS
    np.testing.assert_array_equal(to.numpy(), aclnn_iree.grid_sampler_2d(x, g, 2, 0, False))
    np.testing.assert_array_equal(shared, x)  # the input was never written
