"""Named regression tests for bugs found by attacks on the library (each reproduces one)."""
import multiprocessing as mp

import numpy as np
import pytest

import aclnn_iree
from aclnn_iree import AclnnError
from aclnn_iree import aclnn as A
from aclnn_iree.ops import reference as R


# IREE caps a dispatch at 65535 workgroups per dimension: a workgroup grid of (.., .., N)
# silently dropped every image n >= 65536.  Dispatches now stride over their work.
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_upsample_more_than_65535_images(layout):
    N = 65537
    go = np.arange(N * 9, dtype=np.float32).reshape(N, 1, 3, 3) % 7
    want = R.upsample_bilinear2d_backward(go, (3, 3), (N, 1, 2, 2), False)
    if layout == "NHWC":
        got = aclnn_iree.upsample_bilinear2d_backward(go.transpose(0, 2, 3, 1).copy(), (3, 3), (N, 2, 2, 1),
                                                     memory_format="NHWC").transpose(0, 3, 1, 2)
    else:
        got = aclnn_iree.upsample_bilinear2d_backward(go, (3, 3), (N, 1, 2, 2))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_grid_sampler_more_than_65535_images(mask):
    N = 65537
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, 1, 2, 2)).astype(np.float32)
    grid = rng.uniform(-1, 1, (N, 1, 2, 2)).astype(np.float32)
    go = rng.standard_normal((N, 1, 1, 2)).astype(np.float32)
    dx, dg = aclnn_iree.grid_sampler_2d_backward(go, x, grid, 0, 1, False, mask)
    rdx, rdg = R.grid_sampler_2d_backward(go, x, grid, 0, 1, False)
    for got, want in ((dx, rdx), (dg, rdg)):
        if got is not None:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _grid_call(q):
    a = lambda *s: np.ones(s, np.float32)  # noqa: E731
    dx, dg = aclnn_iree.grid_sampler_2d_backward(a(1, 1, 2, 2), a(1, 1, 3, 3), a(1, 2, 2, 2) * 0)
    q.put(float(dx.sum()))


# A fork()ed child inherited the parent's local-task device, whose worker threads do not
# survive fork: its first call hung forever.  Children now create their own devices.
def test_forked_child_can_call_after_the_parent_did():
    a = lambda *s: np.ones(s, np.float32)  # noqa: E731
    aclnn_iree.grid_sampler_2d_backward(a(1, 1, 2, 2), a(1, 1, 3, 3), a(1, 2, 2, 2) * 0)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_grid_call, args=(q,))
    p.start()
    p.join(60)
    hung = p.is_alive()
    if hung:
        p.kill()
    assert not hung, "the forked child hung"
    assert p.exitcode == 0 and q.get(timeout=5) == 4.0  # 4 output points, all weight on one pixel


# Destroying an output between the phases made the zero-fill launch fail inside IREE and left
# the stream failed for good; now phase 2 reports the destroyed tensor and the stream goes on.
@pytest.mark.parametrize("empty", [True, False], ids=["zero-fill-path", "kernel-path"])
def test_tensor_destroyed_between_the_phases(empty):
    st, s = A.aclrtCreateStream("local-task")
    x = A.aclCreateTensor(np.ones((1, 2, 5, 5), np.float32))
    dx = A.aclCreateTensor(shape=(1, 2, 5, 5), dtype=np.float32)
    ho = 0 if empty else 3
    go = A.aclCreateTensor(np.ones((1, 2, ho, 4), np.float32))
    g = A.aclCreateTensor(np.zeros((1, ho, 4, 2), np.float32))
    dg = A.aclCreateTensor(shape=(1, ho, 4, 2), dtype=np.float32)
    st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(go, x, g, 0, 0, False,
                                                              A.aclCreateBoolArray([True, True]), dx, dg)
    assert st == A.ACLNN_SUCCESS
    buf = A.aclrtMalloc(ws, s)[1] if ws else None
    assert A.aclDestroyTensor(dx) == A.ACLNN_SUCCESS
    assert A.aclnnGridSampler2DBackward(buf, ws, ex, s) == A.ACLNN_ERR_PARAM_NULLPTR
    assert "destroyed" in A.aclGetRecentErrMsg()
    assert A.aclrtSynchronizeStream(s) == A.ACLNN_SUCCESS
    # the stream still runs work
    dx2 = A.aclCreateTensor(shape=(1, 2, 5, 5), dtype=np.float32)
    st, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(go, x, g, 0, 0, False,
                                                              A.aclCreateBoolArray([True, True]), dx2, dg)
    buf = A.aclrtMalloc(ws, s)[1] if ws else None
    assert A.aclnnGridSampler2DBackward(buf, ws, ex, s) == A.ACLNN_SUCCESS
    assert A.aclrtSynchronizeStream(s) == A.ACLNN_SUCCESS
    assert A.aclrtDestroyStream(s) == A.ACLNN_SUCCESS


# Inputs that used to escape the Pythonic layer as a bare ValueError / MemoryError /
# TypeError, or were accepted without a word.
def _small():
    f = np.float32
    return np.ones((1, 1, 2, 2), f), np.ones((1, 1, 3, 3), f), np.zeros((1, 2, 2, 2), f)


def test_read_only_arrays_are_accepted():
    go, x, g = _small()
    ro = np.frombuffer(x.tobytes(), np.float32).reshape(x.shape)
    assert not ro.flags.writeable
    dx, dg = aclnn_iree.grid_sampler_2d_backward(go, ro, g)
    np.testing.assert_array_equal(dx, aclnn_iree.grid_sampler_2d_backward(go, x, g)[0])
    go_ro = np.frombuffer(np.ones(16, np.float32).tobytes(), np.float32).reshape(1, 1, 4, 4)
    assert aclnn_iree.upsample_bilinear2d_backward(go_ro, (4, 4), (1, 1, 2, 2)).shape == (1, 1, 2, 2)


def test_big_endian_arrays_are_float32():
    go, x, g = _small()
    dx, _ = aclnn_iree.grid_sampler_2d_backward(go, x.astype(">f4"), g)
    assert dx.dtype == np.float32


@pytest.mark.parametrize("input_size", [(1, 1, 10**6, 10**6), (1, 1, 2**32, 2**32)])
def test_unallocatable_output_is_an_aclnn_error(input_size):
    with pytest.raises(AclnnError) as e:
        aclnn_iree.upsample_bilinear2d_backward(np.ones((1, 1, 2, 2), np.float32), (2, 2), input_size)
    assert e.value.status == 161002 and "grad_input" in str(e.value)


@pytest.mark.parametrize("mask", [5, "ab", (None, None), (1, 0), np.array([[True, False]]), (True,),
                                  (True, False, True)])
def test_bad_output_mask_is_an_aclnn_error(mask):
    with pytest.raises(AclnnError) as e:
        aclnn_iree.grid_sampler_2d_backward(*_small(), output_mask=mask)
    assert e.value.status == 161002 and "output_mask" in str(e.value)


@pytest.mark.parametrize("op", ["grid", "upsample"])
def test_align_corners_must_be_a_bool_in_both_ops(op):
    with pytest.raises(AclnnError) as e:
        if op == "grid":
            aclnn_iree.grid_sampler_2d_backward(*_small(), align_corners=2)
        else:
            aclnn_iree.upsample_bilinear2d_backward(np.ones((1, 1, 4, 4), np.float32), (4, 4), (1, 1, 2, 2),
                                                   align_corners=1)
    assert e.value.status == 161002 and "align_corners" in str(e.value)


def test_pythonic_messages_use_pytorch_names():
    with pytest.raises(AclnnError) as e:
        aclnn_iree.grid_sampler_2d_backward(*_small(), interpolation_mode=1.0)
    assert "interpolation_mode" in str(e.value) and "interpolationMode" not in str(e.value)


def test_huge_aclrtmalloc_is_a_runtime_error():
    st, buf = A.aclrtMalloc(10**15, "local-task")
    assert (st, buf) == (A.ACLNN_ERR_RUNTIME_ERROR, None)
    assert "could not allocate" in A.aclGetRecentErrMsg()


# Found by the new-user attack of session 2 -------------------------------------------------
def _gs_aclnn_tensors(seed=0):
    rng = np.random.default_rng(seed)
    go = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    x = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    g = rng.uniform(-1, 1, (1, 3, 4, 2)).astype(np.float32)
    return go, x, g, [A.aclCreateTensor(a) for a in (go, x, g)]


@pytest.mark.parametrize("alias", ["inputGrad=input", "gridGrad=grid", "inputGrad=gradOutput", "gridGrad=inputGrad"])
def test_outputs_that_alias_inputs_are_invalid(alias):
    """Phase 1 once accepted inputGrad=input, gridGrad=grid and the CPU result was silently wrong.
    (aclCreateTensor copies its array, so two tensors share memory only when they are one.)"""
    go, x, g, (Go, X, G) = _gs_aclnn_tensors()
    dx = A.aclCreateTensor(shape=x.shape, dtype=x.dtype)
    dg = A.aclCreateTensor(shape=g.shape, dtype=g.dtype)
    if alias == "inputGrad=input":
        dx = X
    elif alias == "gridGrad=grid":
        dg = G
    elif alias == "inputGrad=gradOutput":  # same shape when H_out, W_out = H, W
        Go = A.aclCreateTensor(np.ones(x.shape, np.float32))
        G = A.aclCreateTensor(np.zeros((1, 5, 6, 2), np.float32))
        dg = A.aclCreateTensor(shape=(1, 5, 6, 2), dtype=np.float32)
        dx = Go
    else:  # input (1, 3, 4, 2) and grid (1, 3, 4, 2) have one shape: one tensor for both outputs
        X = A.aclCreateTensor(np.ones((1, 3, 4, 2), np.float32))
        Go = A.aclCreateTensor(np.ones((1, 3, 3, 4), np.float32))
        dx = dg = A.aclCreateTensor(shape=(1, 3, 4, 2), dtype=np.float32)
    status, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(Go, X, G, 0, 0, False,
                                                                 A.aclCreateBoolArray([True, True]), dx, dg)
    assert (status, ws, ex) == (A.ACLNN_ERR_PARAM_INVALID, 0, None)
    assert "shares memory" in A.aclGetRecentErrMsg()


def test_masked_out_output_may_be_any_tensor_of_the_right_shape():
    go, x, g, (Go, X, G) = _gs_aclnn_tensors()
    dx = A.aclCreateTensor(shape=x.shape, dtype=x.dtype)
    status, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(Go, X, G, 0, 0, False,
                                                                 A.aclCreateBoolArray([True, False]), dx, G)
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    assert A.aclDestroyAclOpExecutor(ex) == A.ACLNN_SUCCESS


def test_upsample_out_aliasing_grad_out_is_invalid():
    go = A.aclCreateTensor(np.ones((1, 1, 4, 4), np.float32), format="NCHW")
    status, ws, ex = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        go, A.aclCreateIntArray([4, 4]), A.aclCreateIntArray([1, 1, 4, 4]), False, -1.0, -1.0, go)
    assert (status, ex) == (A.ACLNN_ERR_PARAM_INVALID, None)
    assert "out shares memory with gradOut" in A.aclGetRecentErrMsg()


@pytest.mark.parametrize("bad", ["yes", 2, 1.0])
def test_deterministic_must_be_a_bool_or_none(bad):
    a = np.ones((1, 1, 2, 2), np.float32)
    with pytest.raises(AclnnError) as e:
        aclnn_iree.grid_sampler_2d_backward(a, a, np.zeros((1, 2, 2, 2), np.float32), deterministic=bad)
    assert e.value.status == A.ACLNN_ERR_PARAM_INVALID and "deterministic" in str(e.value)


def test_messages_name_the_status_once_and_stay_short():
    with pytest.raises(AclnnError) as e:
        aclnn_iree.upsample_bilinear2d_backward(np.ones((1, 1, 8, 10), np.float32), (8.0, 10.0), (1, 1, 4, 5))
    assert str(e.value).count("161002") == 1 and "8.0 is not an integer" in str(e.value)
    # a NumPy array passed as the workspace: named by shape and dtype, not printed whole
    st, stream = A.aclrtCreateStream("local-task")
    go, x, g, tensors = _gs_aclnn_tensors()
    dx, dg = A.aclCreateTensor(shape=x.shape, dtype=x.dtype), A.aclCreateTensor(shape=g.shape, dtype=g.dtype)
    status, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(*tensors, 0, 0, False,
                                                                 A.aclCreateBoolArray([True, True]), dx, dg)
    assert status == A.ACLNN_SUCCESS and ws > 0
    assert A.aclnnGridSampler2DBackward(np.zeros(100000, np.uint8), ws, ex, stream) == A.ACLNN_ERR_PARAM_INVALID
    msg = A.aclGetRecentErrMsg()
    assert "ndarray(shape=(100000,), dtype=uint8)" in msg and len(msg) < 300
    A.aclDestroyAclOpExecutor(ex)


def test_zero_dimensional_grad_output_is_reported_with_its_shape():
    with pytest.raises(AclnnError) as e:
        aclnn_iree.grid_sampler_2d_backward(np.float32(1), np.ones((1, 1, 2, 2), np.float32),
                                            np.zeros((1, 1, 1, 2), np.float32))
    assert "got shape ()" in str(e.value)


# The grid sampler ignored aclTensor.format: NHWC tensors were read as NCHW, with SUCCESS
# and wrong gradients.  aclnn's grid sampler takes ND tensors; NHWC is now refused.
@pytest.mark.parametrize("which", range(5))
def test_grid_sampler_refuses_nhwc_tensors(which):
    go, x, g, _ = _gs_aclnn_tensors()
    arrays = [go, x, g, np.zeros_like(x), np.zeros_like(g)]
    names = ["gradOutput", "input", "grid", "inputGrad", "gridGrad"]
    tensors = [A.aclCreateTensor(a, "NHWC" if k == which else "ND") for k, a in enumerate(arrays)]
    status, _, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        *tensors[:3], 0, 0, False, A.aclCreateBoolArray([True, True]), *tensors[3:])
    assert status == A.ACLNN_ERR_PARAM_INVALID and ex is None
    msg = A.aclGetRecentErrMsg()
    assert f"{names[which]} has format NHWC" in msg


# aclCreateTensor truncated non-integer shapes (2.5 -> 2, "3" -> 3) and reported a bad dtype
# or an unallocatable shape in NumPy's words, without a status.
@pytest.mark.parametrize("shape,dtype,words", [
    ((2.5, 2), np.float32, "not all ints"), (("3", 2), np.float32, "not all ints"),
    ((True, 2), np.float32, "not all ints"), (3, np.float32, "sequence of ints"),
    ((2, 2), "nope", "dtype"), ((2**40, 2**40), np.float32, "cannot be allocated")])
def test_create_tensor_bad_shape_or_dtype_has_a_status(shape, dtype, words):
    assert A.aclCreateTensor(shape=shape, dtype=dtype) is None
    msg = A.aclGetRecentErrMsg()
    assert msg.startswith("ACLNN_ERR_PARAM_INVALID (161002)") and words in msg


# A destroyed stream still served aclCreateTensor(stream=) and aclrtMalloc.
def test_destroyed_stream_is_refused_everywhere():
    st, stream = A.aclrtCreateStream("local-task")
    assert A.aclrtDestroyStream(stream) == A.ACLNN_SUCCESS
    assert A.aclCreateTensor(np.zeros(4, np.float32), stream=stream) is None
    assert "destroyed" in A.aclGetRecentErrMsg()
    status, buf = A.aclrtMalloc(64, stream)
    assert status == A.ACLNN_ERR_PARAM_INVALID and buf is None and "destroyed" in A.aclGetRecentErrMsg()


# An empty output whose other extents NumPy cannot represent raised NumPy's ValueError.
def test_unrepresentable_empty_output_is_an_aclnn_error():
    with pytest.raises(AclnnError) as e:
        aclnn_iree.upsample_bilinear2d_backward(np.zeros((0, 3, 8, 10), np.float32), (8, 10), (0, 3, 2**40, 2**40))
    assert e.value.status == A.ACLNN_ERR_PARAM_INVALID and "grad_input" in str(e.value)


# aclCreateTensor's copy started wherever NumPy's allocator put it (16 bytes off a cache
# line for large arrays), so large outputs rarely got the kernels' non-temporal stores.
@pytest.mark.parametrize("from_array", [True, False])
def test_created_tensors_start_on_a_cache_line(from_array):
    for n in (3, 1000, 1 << 20):
        t = (A.aclCreateTensor(np.arange(n, dtype=np.float32)) if from_array
             else A.aclCreateTensor(shape=(n,), dtype=np.float32))
        assert t.host.ctypes.data % 64 == 0
        np.testing.assert_array_equal(t.numpy(), np.arange(n, dtype=np.float32) if from_array else np.zeros(n))


# Near overflow (docs/semantics.md): bilinear grad_grid sums C channel terms
# go * (x_east - x_west) * weight.  Where only the sum overflows, the result is the exact
# value's +-inf, as PyTorch's.  Where single terms overflow with both signs, the sum is
# inf - inf = NaN in ours; PyTorch gives +-inf there, whose sign agrees with the exact sum's
# in about half of the elements (an accident of its order, measured below): no kernel that
# sums in the dtype's range can know that sign.
def _exact_in_dtype(go, x, grid, dtype):
    """The exact grad_grid rounded to `dtype` (+-inf beyond its range): the float64 reference
    on inputs scaled by a power of two (exact), scaled back in Python's float range check."""
    k = 2.0 ** (-100 if dtype == np.float32 else -600)  # products stay normal float64 numbers
    _, d = R.grid_sampler_2d_backward(go.astype(np.float64) * k, x.astype(np.float64) * k, grid.astype(np.float64),
                                      0, 0, False)
    top = float(np.finfo(dtype).max) * k * k
    beyond = np.abs(d) > top * (1 + np.finfo(dtype).eps / 2)
    return np.where(beyond, np.sign(d) * np.inf, np.where(beyond, 0.0, d) / k / k).astype(dtype)


def _overflow_case(dtype, per_term: bool):
    rng = np.random.default_rng(11)
    N, C, H, W, Ho, Wo = 2, 16, 5, 6, 4, 4
    big = float(np.finfo(dtype).max) ** (0.9 if per_term else 0.5) / (2 if per_term else 4)
    go = big * rng.uniform(0.5, 1, (N, C, Ho, Wo)) * (rng.choice([-1, 1], (N, C, Ho, Wo)) if per_term else 1)
    x = big * rng.uniform(0.5, 1, (N, C, H, W)) * np.where(np.arange(W) % 2, 1, -1)
    grid = rng.uniform(-1, 1, (N, Ho, Wo, 2))
    return go.astype(dtype), x.astype(dtype), grid.astype(dtype)


@pytest.mark.parametrize("device", ["local-task", "local-sync", "vulkan"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grad_grid_whose_sum_overflows_is_the_exact_infinity(dtype, device):
    from conftest import require_device
    require_device(device)
    go, x, grid = _overflow_case(dtype, per_term=False)
    _, dg = aclnn_iree.grid_sampler_2d_backward(go, x, grid, device=device)
    want = _exact_in_dtype(go, x, grid, dtype)
    inf = np.isinf(want)
    assert inf.any() and (~inf).any()
    assert np.array_equal(dg[inf], want[inf])
    np.testing.assert_allclose(dg[~inf], want[~inf], rtol=1e-4 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("device", ["local-task", "local-sync", "vulkan"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grad_grid_whose_terms_overflow_with_both_signs_is_nan_never_a_wrong_infinity(dtype, device):
    from conftest import require_device
    require_device(device)
    torch = pytest.importorskip("torch")
    go, x, grid = _overflow_case(dtype, per_term=True)
    with np.errstate(over="ignore", invalid="ignore"):
        _, dg = aclnn_iree.grid_sampler_2d_backward(go, x, grid, device=device)
    want = _exact_in_dtype(go, x, grid, dtype)
    assert np.isinf(want).all()  # every exact value is beyond the dtype's range
    nan = np.isnan(dg)
    assert nan.any() and np.array_equal(dg[~nan], want[~nan])  # NaN or the exact +-inf
    theirs = torch.ops.aten.grid_sampler_2d_backward(*(torch.from_numpy(a) for a in (go, x, grid)), 0, 0, False,
                                                     [True, True])[1].numpy()
    assert np.isinf(theirs).all() and (np.sign(theirs) != np.sign(want)).any()  # PyTorch's: some wrong signs
