"""The CPU upsample kernel's forms (templates/upsample_bilinear2d_backward/: cpu.mlir.j2 and the
nchw_*, nhwc and same_size partials).

* NHWC runs separably, an H pass into a stack tile of output columns, then a W pass, in
  the NCHW kernel's order of operations: the two layouts give the same bits.  The tile
  holds row_cap / C_padded columns, so wide rows take several tiles (whose windows
  overlap) and many channels take short tiles.
* A W window longer than a tile (W up-sampled ~64x in float32, ~32x in float64) or more
  channels than a tile holds takes the direct per-pixel form instead, and NCHW rows
  longer than its stack row a scalar form: both sum in the separable order, so every
  form gives the same bits; checked against the float64 reference with the
  dtype-derived bound of test_dtypes too.
* The order of the two passes is chosen per call (the template's pass_order): the H pass
  first costs H_in * W_out * K_H taps in its first pass, the W pass first H_out * W_in *
  K_W, and the cheaper runs (a tie, as in every equal-ratio resize, keeps H first).  The
  W-first forms walk a block's dx rows in runs whose dy rows fit the stack tile, with
  column tiles; a row whose window alone does not fit takes a scalar (NCHW) or per-pixel
  (NHWC) form in the same order: the layouts again give the same bits.
* dx of at least 4 MiB is written with non-temporal stores where the output and its rows
  are 64-byte aligned, with masked stores elsewhere: both give the same bits.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aclnn_iree import aclnn as A
from aclnn_iree.core.tensors import tensor_over
from aclnn_iree.core import api
from aclnn_iree.ops import reference as R
from aclnn_iree.compiler import specs
from test_dtypes import BF16, F16, F32, F64, UpsampleCase, check_case, error_bound

DEVICE = "local-task"  # the forms under test are the CPU kernel's


def _both_layouts(go, out_hw, in_hw, ac):
    """dx from the NCHW and from the NHWC kernel, both as NCHW arrays."""
    N, C = go.shape[:2]
    nchw = api.upsample_bilinear2d_backward(go, out_hw, (N, C) + in_hw, ac, device=DEVICE)
    nhwc = api.upsample_bilinear2d_backward(np.ascontiguousarray(go.transpose(0, 2, 3, 1)), out_hw,
                                            (N,) + in_hw + (C,), ac, memory_format="NHWC", device=DEVICE)
    return nchw, np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2))


def _tile_columns(dtype, C):
    """Output columns per NHWC stack tile (0: none fits, the direct form runs)."""
    params = specs.UpsampleSpec(False, np.dtype(dtype).name).template_params()
    chunk = 4 * params["vector_width"]
    return params["row_cap"] // (-(-C // chunk) * chunk)


# (N, C, (H_in, W_in), (H_out, W_out)): several tiles per row, many channels (short tiles),
# a channel count that is no multiple of the chunk, down-sampling, mixed directions, and
# exact 2x down-sampling (the NCHW W pass fetches whole groups with a load and a shuffle
# where the windows start two lanes per output; the last group of 56 columns takes the
# gather), and grad_output narrower than a vector, where NCHW takes 8 planes per workgroup
# (dx 1 x 2000 <- 2000 x 1: 4000 taps per H sum; 21 planes, a group of 5 at the end);
# there, with grad_output one column wide, float32 sums 8 taps of the 8 planes at a time
# (dx rows whose windows start anywhere, some with fewer than 8 taps in the column: 7 x 300
# <- 500 x 1 in 33 planes, 3 x 40 <- 19 x 1), and the W pass stores the chunks outside the
# range with hits as zeros (2 x 2000 <- 9 x 1: taps on a few columns).
SEPARABLE_SHAPES = [
    (2, 64, (6, 150), (11, 300)),
    (1, 300, (5, 40), (9, 80)),
    (2, 19, (7, 33), (13, 65)),
    (1, 8, (30, 200), (14, 90)),
    (1, 5, (4, 100), (9, 37)),
    (2, 5, (20, 56), (10, 28)),
    (2, 32, (1, 2000), (2000, 1)),
    (3, 7, (5, 30), (200, 4)),
    (3, 11, (7, 300), (500, 1)),
    (1, 9, (3, 40), (19, 1)),
    (2, 3, (2, 2000), (9, 1)),
    # W up-sampled exactly 2x, 4x and 8x, rows of several vectors: the W pass's strided loads
    (2, 5, (6, 40), (12, 80)),
    (1, 4, (3, 37), (7, 74)),
    (1, 3, (4, 48), (16, 192)),
    (1, 2, (5, 64), (9, 256)),
    (1, 3, (8, 40), (64, 320)),
    # ... with H down-sampled: W first, its W pass reading grad_output rows strided
    (2, 3, (24, 40), (6, 80)),
    (1, 2, (40, 33), (10, 132)),
    (1, 2, (48, 20), (6, 160)),
]


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SEPARABLE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}_{s[2]}to{s[3]}")
def test_nhwc_gives_the_nchw_bits(shape, dtype, ac):
    N, C, in_hw, out_hw = shape
    go = np.random.default_rng(11).standard_normal((N, C) + out_hw).astype(dtype)
    nchw, nhwc = _both_layouts(go, out_hw, in_hw, ac)
    np.testing.assert_array_equal(nhwc.view(np.uint8), nchw.view(np.uint8))
    check_case(UpsampleCase("separable", go.astype(np.float64), in_hw, ac, "NHWC"), dtype)


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("what", ["window", "channels", "long_rows"])
def test_other_forms_give_the_same_bits(what, dtype):
    """NHWC's per-pixel form, where a tile holds less than one W window (W 2 -> 300) or no
    column at all (more channels than the tile's values), and NCHW's scalar form for rows
    longer than its stack row (W_out 5000): the bits of the separable form, and within
    the reference's bound."""
    if what == "window":
        C, in_hw, out_hw = 3, (3, 2), (5, 300)
        assert _tile_columns(dtype, C) < 300  # the window (~300 columns) exceeds the tile
    elif what == "channels":
        C, in_hw, out_hw = 8200, (2, 3), (3, 5)
        assert _tile_columns(dtype, C) == 0
    else:
        C, in_hw, out_hw = 2, (5, 4000), (6, 5000)
        assert out_hw[1] > specs.UpsampleSpec(False, np.dtype(dtype).name).template_params()["row_cap"]
    go = np.random.default_rng(12).standard_normal((1, C) + out_hw)
    for ac in (False, True):
        nchw, nhwc = _both_layouts(go.astype(dtype), out_hw, in_hw, ac)
        np.testing.assert_array_equal(nhwc.view(np.uint8), nchw.view(np.uint8))
        check_case(UpsampleCase(what, go, in_hw, ac, "NHWC"), dtype)
        check_case(UpsampleCase(what, go, in_hw, ac, "NCHW"), dtype)


# Both axes keeping their size (PyTorch maps each onto itself, given scales or not): the
# elementwise same-size pass (`<kernel>_same_size`), in chunks of UPSAMPLE_SAME_CHUNK
# elements over the workgroups, 16 lanes with a masked tail: shapes of one element, of a
# partial vector, of several chunks with a tail, and of a plane wider than a chunk.
SAME_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 6), (3, 17, 33, 29), (1, 2, 1, 9000), (2, 5, 181, 97)]


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_same_size_is_pytorchs_identity_bit_for_bit(fmt, dtype):
    """dx = grad_output * 1 + 0.0 (-0.0 becomes +0.0, inf and NaN stay), which for finite
    values are PyTorch's own bits (its weights 1 and 0 in float32, or float64); the same
    function is picked by phase 1, without workspace, and the threaded and inline devices
    agree."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(31)
    st = np.dtype(dtype)
    ct = np.float64 if st == np.float64 else np.float32
    for N, C, H, W in SAME_SHAPES:
        go = (rng.standard_normal((N, C, H, W)) * 10.0 ** rng.uniform(-4, 4, (N, C, H, W))).astype(dtype)
        flat = go.reshape(-1)
        flat[rng.integers(0, flat.size, 2)] = -0.0
        a = go if fmt == "NCHW" else np.ascontiguousarray(go.transpose(0, 2, 3, 1))
        isz = (N, C, H, W) if fmt == "NCHW" else (N, H, W, C)
        tg = torch.from_numpy(go.astype(ct))
        if fmt == "NHWC":
            tg = tg.contiguous(memory_format=torch.channels_last)
        for ac, sc in ((False, None), (True, None), (False, 1.0), (True, 1.0 + 0.5 / max(H, W))):
            got = api.upsample_bilinear2d_backward(a, (H, W), isz, ac, sc, sc, memory_format=fmt, device=DEVICE)
            want = torch.ops.aten.upsample_bilinear2d_backward(tg, [H, W], [N, C, H, W], ac, sc, sc).numpy()
            want = (want if fmt == "NCHW" else want.transpose(0, 2, 3, 1)).astype(dtype)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{(N, C, H, W)} {ac} {sc}")
        sync = api.upsample_bilinear2d_backward(a, (H, W), isz, False, memory_format=fmt, device="local-sync")
        np.testing.assert_array_equal(sync.view(np.uint8), got.view(np.uint8))
    # infinities and NaN pass through (PyTorch's 0-weight neighbour makes NaN of an infinity)
    go = np.array([np.inf, -np.inf, np.nan, -0.0, 1.5, -2.0]).astype(dtype).reshape(1, 1, 2, 3)
    a = go if fmt == "NCHW" else go.transpose(0, 2, 3, 1).copy()
    got = api.upsample_bilinear2d_backward(a, (2, 3), a.shape, False, memory_format=fmt, device=DEVICE)
    want = (go.astype(ct) + ct(0)).astype(dtype)
    want = want if fmt == "NCHW" else want.transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    # phase 1 picks the same-size function, with no workspace
    t_go, t_out = A.aclCreateTensor(a, fmt), A.aclCreateTensor(np.zeros_like(a), fmt)
    status, ws, ex = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        t_go, A.aclCreateIntArray([2, 3]), A.aclCreateIntArray(list(a.shape)), False, 0.0, 0.0, t_out)
    assert status == 0 and ws == 0 and ex.kernel.name.endswith("_same_size")


# (N, C, (H_in, W_in), (H_out, W_out)), each taking the W pass first: H down-sampled 2000x
# while W is up-sampled 2000x (the H-first order's worst case: H_in * W_out taps per plane;
# one block per plane computes u once; dx one column wide: for tiles narrower than a vector
# the NCHW form's W pass sums scalars and its H pass runs along the rows, its stores
# contiguous), moderate mixed ratios, several column tiles in
# both layouts (NCHW: runs of ~56 dy rows, 64-column tiles; NHWC: 6-column tiles), a
# window taller than the tile (both axes up-sampled hundreds of times: the scalar and
# per-pixel forms), more channels than the NHWC tile holds, a channel count that is no
# multiple of the chunk.  NCHW dx narrower than a vector takes 8 planes per workgroup where
# their u rows fit the stack row beside the tallest window (W * 8 * K_H elements): 21 planes
# (a group of 5 at the end), 3 x 7 <- 64 x 1000 (K_H = 44: grouped in float32, not in
# float64, whose stack row holds half as many), 2 x 15 <- 64 x 1000 (K_H = 64: one plane
# at a time); one-column dx in groups whose chunks of 16 rows mix rows with taps and rows
# without (stored as zeros): 300 x 1 <- 2 x 900 in 21 planes, 40 x 1 <- 7 x 90 in 5.  (test_devices checks on the GPU, through the workspace, that the template
# takes the W pass first for each.)
W_FIRST_SHAPES = [
    (2, 32, (2000, 1), (1, 2000)),
    (1, 5, (40, 3), (7, 90)),
    (1, 2, (20, 600), (60, 2400)),
    (1, 3, (2, 2), (700, 900)),
    (1, 8200, (3, 2), (3, 5)),
    (2, 19, (50, 3), (2, 70)),
    (3, 7, (30, 5), (4, 200)),
    (1, 2, (3, 7), (64, 1000)),
    (1, 3, (2, 15), (64, 1000)),
    (3, 7, (300, 1), (2, 900)),
    (1, 5, (40, 1), (7, 90)),
]


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", W_FIRST_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}_{s[2]}to{s[3]}")
def test_w_first_forms_give_the_same_bits_in_both_layouts(shape, dtype):
    N, C, in_hw, out_hw = shape
    go = np.random.default_rng(14).standard_normal((N, C) + out_hw)
    for ac in (False, True):
        nchw, nhwc = _both_layouts(go.astype(dtype), out_hw, in_hw, ac)
        np.testing.assert_array_equal(nhwc.view(np.uint8), nchw.view(np.uint8))
        check_case(UpsampleCase("w_first", go, in_hw, ac, "NCHW"), dtype)


def _aclnn_dx(go, fmt, input_size, out_hw, offset):
    """dx through the aclnn API, written into an output whose data starts `offset` bytes
    past a 64-byte boundary.  aclCreateTensor copies into memory of its own (64-byte
    aligned), so the output wraps the array itself, as the Pythonic layer wraps the
    caller's arrays (host memory is imported as it is where 16-byte aligned)."""
    dt = go.dtype
    nbytes = int(np.prod(input_size)) * dt.itemsize
    raw = np.zeros(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out_arr = raw[start:start + nbytes].view(dt).reshape(input_size)
    status, stream = A.aclrtCreateStream(DEVICE)
    assert status == A.ACLNN_SUCCESS
    out = tensor_over(stream.device, out_arr, fmt)
    assert np.shares_memory(out.host, out_arr) == (offset % 16 == 0)
    status, ws, ex = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        A.aclCreateTensor(go, fmt, stream=stream), A.aclCreateIntArray(list(out_hw)),
        A.aclCreateIntArray(list(input_size)), False, -1.0, -1.0, out)
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    workspace = None
    if ws:
        status, workspace = A.aclrtMalloc(ws, stream)
        assert status == A.ACLNN_SUCCESS
    assert A.aclnnUpsampleBilinear2dBackwardV2(workspace, ws, ex, stream) == A.ACLNN_SUCCESS
    assert A.aclrtSynchronizeStream(stream) == A.ACLNN_SUCCESS
    return out_arr.copy() if offset % 16 == 0 else out.numpy().copy()


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_large_dx_any_output_alignment(fmt):
    """4 MiB of float32 dx (non-temporal stores where aligned): a 64-byte aligned output and
    ones 16, 32 and 48 bytes off (written in place) and 4 bytes off (imported as an aligned
    copy) give the same bits, within the float32 bound of the reference (scale 2: exact
    weights, so only the float32 sums round)."""
    N, C, H, W = 16, 64, 32, 32
    go = np.random.default_rng(13).standard_normal((N, C, 2 * H, 2 * W)).astype(np.float32)
    size = (N, C, H, W) if fmt == "NCHW" else (N, H, W, C)
    go_l = go if fmt == "NCHW" else np.ascontiguousarray(go.transpose(0, 2, 3, 1))
    assert int(np.prod(size)) * 4 >= 4 << 20
    results = [_aclnn_dx(go_l, fmt, size, (2 * H, 2 * W), off) for off in (0, 16, 32, 48, 4)]
    for r in results[1:]:
        np.testing.assert_array_equal(r.view(np.uint8), results[0].view(np.uint8))
    dx = results[0] if fmt == "NCHW" else results[0].transpose(0, 3, 1, 2)
    g64 = go.astype(np.float64)
    want = R.upsample_bilinear2d_backward(g64, (2 * H, 2 * W), (N, C, H, W), False)
    S = R.upsample_bilinear2d_backward(np.abs(g64), (2 * H, 2 * W), (N, C, H, W), False)  # weights >= 0
    bound, _ = error_bound(want, S, 16, 0.0, F32)  # at most 4 x 4 taps per dx pixel
    assert np.all(np.abs(dx - want) <= bound)


@settings(max_examples=100, deadline=None)
@given(N=st.integers(1, 2), C=st.integers(1, 40), H=st.integers(1, 60), W=st.integers(1, 60),
       Ho=st.integers(1, 60), Wo=st.integers(1, 60), ac=st.booleans(), dtype=st.sampled_from([F32, BF16]),
       seed=st.integers(0, 2**16))
def test_both_layouts_give_the_same_bits_for_any_sizes(N, C, H, W, Ho, Wo, ac, dtype, seed):
    """For any sizes, whichever pass order pass_order picks and whichever form runs, NHWC
    gives the NCHW kernel's bits (both take the order from the sizes alone)."""
    go = np.random.default_rng(seed).standard_normal((N, C, Ho, Wo)).astype(dtype)
    nchw, nhwc = _both_layouts(go, (Ho, Wo), (H, W), ac)
    np.testing.assert_array_equal(nhwc.view(np.uint8), nchw.view(np.uint8))
