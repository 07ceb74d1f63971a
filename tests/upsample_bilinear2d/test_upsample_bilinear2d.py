"""upsample_bilinear2d (the forward, templates/upsample_bilinear2d/): numbers.

* Against the float64 reference (aclnn_iree.ops.reference.upsample_bilinear2d) in every
  dtype, with test_dtypes' dtype-derived bound: each output element is 4 terms (n = 4), S the
  forward of |input|, A the source-index error (delta_h + delta_w, 4 * u32 * (in + 1) per
  axis) times the largest |input| (the weights are computed in float32 for the half types).
* Against PyTorch 2.13 CPU (torch.ops.aten.upsample_bilinear2d; a channels_last tensor for
  NHWC) bitwise in float32 and float64 on the CPU devices: the templates take PyTorch's
  source-index and blend expressions, fma where its AVX512 build contracts them, and its
  choice between its channels-last and generic kernels (C > 3 in channels_last, or
  H_out + W_out <= 128; both cases are covered below).  On Vulkan (Mesa's lavapipe, which may
  evaluate fma unfused) the bound only, and the same non-finite pattern as PyTorch.
* Structured inputs: up, down, mixed (H down, W up), same size (no copy shortcut: an inf
  beside a kept pixel gives NaN through its weight 0, as in PyTorch), size-1 axes, given
  scales, subnormals, inf/NaN, many channels.
"""
import ml_dtypes
import numpy as np
import pytest

from aclnn_iree.core import api
from aclnn_iree.ops import reference as ref
from conftest import is_gpu, require_device, torch_like_ours
from test_dtypes import BF16, F16, F32, F64, U32, check_f64, check_half

try:
    import torch
except ImportError:
    torch = None

DTYPES = (F32, F64, F16, BF16)
LAYOUTS = ("NCHW", "NHWC")

# (name, (N, C, H, W), (H_out, W_out), scales_h, scales_w)
CASES = [
    ("up", (2, 5, 7, 9), (15, 20), None, None),
    ("down", (1, 6, 19, 23), (8, 9), None, None),
    ("mixed", (1, 4, 40, 6), (17, 130), None, None),  # H down, W up; H_out + W_out > 128
    ("same", (1, 5, 6, 7), (6, 7), None, None),
    ("one-row", (2, 3, 1, 9), (1, 140), None, None),
    ("to-one", (1, 4, 9, 11), (1, 1), None, None),
    ("column", (1, 5, 200, 1), (1, 200), None, None),
    # W_out = 1: the CPU NCHW form's lanes go along H (cpu_nchw column_rows); H up from one
    # row with the channels-last blend (H_out + W_out <= 128), H down, and the generic blend
    ("to-column", (2, 3, 1, 50), (70, 1), None, None),
    ("column-down", (1, 4, 37, 23), (19, 1), None, None),
    ("column-generic", (1, 3, 60, 9), (150, 1), None, None),
    ("scales", (1, 5, 10, 12), (23, 28), 2.3, 2.4),
    ("generic-wide", (1, 21, 30, 40), (77, 91), None, None),
    ("many-channels", (1, 70, 5, 6), (9, 11), None, None),
]



@pytest.fixture(autouse=True)
def _each_form(kernel_form):
    """Every test of this module runs on the tuned kernels and on the linalg form (the same
    bounds, and PyTorch's bits on CPUs: both compute PyTorch's float expressions; the linalg
    form's subnormals flushed as IREE's CPU executors do, against PyTorch's flushing them)."""

def run(x, osz, ac, sh, sw, layout, device):
    """Our output, as an NCHW array, for the NCHW array x."""
    if layout == "NHWC":
        y = api.upsample_bilinear2d(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), osz, ac, sh, sw,
                                    memory_format="NHWC", device=device)
        return y.transpose(0, 3, 1, 2)
    return api.upsample_bilinear2d(x, osz, ac, sh, sw, device=device)


def torch_out(x, osz, ac, sh, sw, layout):
    t = torch.from_numpy(np.ascontiguousarray(x))
    if layout == "NHWC":
        t = t.contiguous(memory_format=torch.channels_last)
    return torch.ops.aten.upsample_bilinear2d(t, list(osz), ac, sh, sw).contiguous().numpy()


def check_reference(y, x, osz, ac, sh, sw, dtype, what):
    r = ref.upsample_bilinear2d(x.astype(np.float64), osz, ac, sh, sw)
    if dtype == F64:
        check_f64(np.ascontiguousarray(y), r, what)
        return
    S = ref.upsample_bilinear2d(np.abs(x.astype(np.float64)), osz, ac, sh, sw)
    H, W = x.shape[2:]
    A = (4 * U32 * (H + 1) + 4 * U32 * (W + 1)) * float(np.abs(x.astype(np.float64)).max())
    check_half(np.ascontiguousarray(y), r, S, 4, A, dtype, what)


def same_bits(y, e, what):
    same = (y == e) | (np.isnan(y) & np.isnan(e))
    same &= (np.signbit(y) == np.signbit(e)) | np.isnan(y)
    assert same.all(), f"{what}: {int((~same).sum())} elements differ from PyTorch, e.g. at {np.argwhere(~same)[0]}"


def same_nonfinite(y, e, what):
    assert np.array_equal(np.isnan(y), np.isnan(e)), f"{what}: NaN pattern differs from PyTorch"
    inf = np.isinf(e)
    assert np.array_equal(np.isinf(y), inf) and np.array_equal(y[inf], e[inf]), f"{what}: inf differs from PyTorch"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ac", (False, True), ids=("ac0", "ac1"))
def test_cases(device, ac, dtype, layout):
    rng = np.random.default_rng(hash((ac, np.dtype(dtype).name, layout)) % 2**32)
    for name, shape, osz, sh, sw in CASES:
        if ac and sh is not None:
            continue  # align_corners ignores the scales: covered without them
        x = rng.standard_normal(shape).astype(dtype)
        what = f"{device}/{layout}/ac{int(ac)}/{np.dtype(dtype).name}/{name}"
        y = run(x, osz, ac, sh, sw, layout, device)
        assert y.dtype == np.dtype(dtype) and y.shape == shape[:2] + osz, what
        check_reference(y, x, osz, ac, sh, sw, np.dtype(dtype), what)
        if torch is not None and dtype in (F32, F64) and not is_gpu(device):
            same_bits(y, torch_out(x, osz, ac, sh, sw, layout), what)


def _special_input(dtype, kind, rng):
    x = rng.standard_normal((1, 20, 12, 13))
    if kind == "nonfinite":
        x[0, :, 3, 4] = np.inf
        x[0, :5, 5, 5] = np.nan
        x[0, 6, 7, 7] = -np.inf
        x[0, 7, 11, 12] = np.inf  # the last row and column
    elif kind == "subnormal":
        x *= float(np.finfo(dtype).smallest_normal) * 4
    elif kind == "signed-zero":
        x = np.where(x > 0, 0.0, -0.0)
    return x.astype(dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", (F32, F64), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kind", ("nonfinite", "subnormal", "signed-zero"))
def test_special_values(device, kind, dtype, layout):
    if torch is None:
        pytest.skip("needs PyTorch")
    rng = np.random.default_rng(5)
    x = _special_input(dtype, kind, rng)
    for osz in ((12, 13), (12, 40), (70, 80), (7, 9), (200, 5)):
        for ac in (False, True):
            what = f"{device}/{layout}/ac{int(ac)}/{np.dtype(dtype).name}/{kind}/{osz}"
            y = run(x, osz, ac, None, None, layout, device)
            with torch_like_ours(torch, device):
                e = torch_out(x, osz, ac, None, None, layout)
            if not is_gpu(device):
                same_bits(y, e, what)
            elif kind == "nonfinite":
                same_nonfinite(y, e, what)
            else:
                check_reference(y, x, osz, ac, None, None, np.dtype(dtype), what)


# Both axes keeping their size: PyTorch samples each element itself with weights 1 and 0, so
# the output is x * 1 + x * 0, x where finite (signed zeros too) and NaN for inf and NaN.  The
# tuned CPU modules run the elementwise pass (`<kernel>_same_size`: chunks of
# UPSAMPLE_SAME_CHUNK elements over the workgroups, 16 lanes with a masked tail), GPUs and the
# linalg forms the resampling pass.  Shapes of one element, of a partial vector, of several
# chunks with a tail, of a plane wider than a chunk.
SAME_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 6), (3, 17, 33, 29), (1, 2, 1, 9000), (2, 5, 181, 97)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_same_size(device, dtype, layout):
    """Every dtype bitwise PyTorch's (its float32 or float64 op math on the values, whose
    result each half type holds exactly; in float32 and float64 on CPUs to the NaNs' bits:
    inf * 0's default NaN and a NaN's own sign and payload), given scales or not, with
    infinities, NaN and signed zeros placed at random; phase 1 picks the elementwise pass
    where there is one."""
    if torch is None:
        pytest.skip("needs PyTorch")
    from aclnn_iree.core import aclnn as A
    rng = np.random.default_rng(17)
    wide = F64 if dtype == F64 else F32
    bits = np.dtype(dtype) in (np.dtype(F32), np.dtype(F64)) and not is_gpu(device)
    for shape in SAME_SHAPES:
        x = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-4, 4, shape)).astype(dtype)
        flat = x.reshape(-1)
        specials = np.array([np.inf, -np.inf, np.nan, -np.nan, -0.0, 0.0], dtype)
        if bits:  # a NaN with a payload of its own
            specials[2:3].view(np.uint32 if dtype == F32 else np.uint64)[0] |= 0x1234
        flat[rng.integers(0, flat.size, specials.size)] = specials
        osz = shape[2:]
        for ac, sc in ((False, None), (True, None), (False, 1.0), (False, 1.0 + 0.5 / max(osz))):
            what = f"{device}/{layout}/{np.dtype(dtype).name}/{shape}/ac{int(ac)}/{sc}"
            y = run(x, osz, ac, sc, sc, layout, device)
            e = torch_out(x.astype(wide), osz, ac, sc, sc, layout).astype(dtype)
            if bits:
                np.testing.assert_array_equal(np.ascontiguousarray(y).view(np.uint8), e.view(np.uint8), err_msg=what)
            else:
                same_bits(y.astype(wide), e.astype(wide), what)
    N, C, H, W = SAME_SHAPES[2]
    shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
    t_x, t_out = (A.aclCreateTensor(np.zeros(shape, dtype), layout, device=device) for _ in range(2))
    status, ws, ex = A.aclnnUpsampleBilinear2dGetWorkspaceSize(t_x, A.aclCreateIntArray([H, W]), False, 0.0, 0.0,
                                                               t_out)
    assert status == 0 and ws == 0, A.aclGetRecentErrMsg()
    tuned_cpu = A.current_form() == "tuned" and not is_gpu(device)
    assert ex.kernel.name.endswith("_same_size") == tuned_cpu, ex.kernel.name


@pytest.mark.parametrize("C", (4, 7, 8, 9, 13, 24, 29, 33))
def test_channels_last_tail(C):
    """PyTorch's channels-last kernel blends its vector channels and its last C mod (32 bytes /
    element) channels in different fma nestings: every split, both dtypes, on the CPU."""
    if torch is None:
        pytest.skip("needs PyTorch")
    rng = np.random.default_rng(C)
    for dtype in (F32, F64):
        x = rng.standard_normal((1, C, 12, 13)).astype(dtype)
        for osz in ((30, 31), (150, 7)):
            for layout in LAYOUTS:
                y = run(x, osz, False, None, None, layout, "local-task")
                same_bits(y, torch_out(x, osz, False, None, None, layout), f"C={C}/{dtype}/{osz}/{layout}")


def test_local_sync():
    """The inline executor (local-sync) runs the same CPU module: the same bits."""
    if torch is None:
        pytest.skip("needs PyTorch")
    rng = np.random.default_rng(3)
    for layout in LAYOUTS:
        for dtype in (F32, F64):
            x = rng.standard_normal((2, 19, 30, 40)).astype(dtype)
            for osz in ((77, 91), (20, 50)):
                y = run(x, osz, False, None, None, layout, "local-sync")
                same_bits(y, torch_out(x, osz, False, None, None, layout), f"local-sync/{layout}/{dtype}/{osz}")


# NCHW rows whose W taps follow a fixed pattern take contiguous loads and shuffles (fetch.mlir.j2):
# W up 2x, 4x, 8x, down 2x, kept, W = 1, each ending at the row's end (a clamped i1); the rest gather.
PATTERN_SIZES = [((5, 64), (7, 128)), ((3, 256), (5, 1024)), ((3, 400), (5, 200)), ((30, 64), (9, 256)),
                 ((3, 1), (4, 2000)), ((6, 100), (6, 100)), ((6, 37), (6, 296)), ((6, 41), (6, 82)),
                 ((6, 41), (6, 20)), ((2, 7), (3, 14))]


@pytest.mark.parametrize("dtype", (F32, F64, F16), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ac", (False, True), ids=("ac0", "ac1"))
def test_fetch_patterns(ac, dtype):
    rng = np.random.default_rng(11)
    for (hw, osz) in PATTERN_SIZES:
        x = rng.standard_normal((1, 2) + hw).astype(dtype)
        if dtype != F16:
            x[0, 0, 0, -1] = np.inf
            x[0, 1, -1, 0] = np.nan
        what = f"ac{int(ac)}/{np.dtype(dtype).name}/{hw}->{osz}"
        y = run(x, osz, ac, None, None, "NCHW", "local-task")
        if dtype == F16:
            check_reference(y, x, osz, ac, None, None, F16, what)
        elif torch is not None:
            same_bits(y, torch_out(x, osz, ac, None, None, "NCHW"), what)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_large_output(layout):
    """Outputs of 64 MiB and more go out in non-temporal stores where aligned (cpu_rows.nt_setup):
    the same bits, aligned or not (C = 16 and 17, W_out a multiple of 16 and not)."""
    if torch is None:
        pytest.skip("needs PyTorch")
    rng = np.random.default_rng(9)
    for C, hw, osz in ((16, (256, 256), (1024, 1024)), (17, (100, 90), (1000, 1001))):
        x = rng.standard_normal((1, C) + hw).astype(np.float32)
        y = run(x, osz, False, None, None, layout, "local-task")
        same_bits(y, torch_out(x, osz, False, None, None, layout), f"{layout}/C={C}/{osz}")


def test_random_shapes_bitwise():
    """60 random calls (sizes, ratios from the fixed fetch patterns to arbitrary ones, both
    layouts and align_corners, given scales, some non-finite inputs): PyTorch's bits on the CPU."""
    if torch is None:
        pytest.skip("needs PyTorch")
    rng = np.random.default_rng(2026)
    for _ in range(60):
        N, C, H, W = int(rng.integers(1, 3)), int(rng.integers(1, 40)), int(rng.integers(1, 70)), int(rng.integers(1, 70))
        kind = int(rng.integers(0, 4))
        if kind == 0:
            osz = (int(rng.integers(1, 140)), int(rng.integers(1, 140)))
        elif kind == 1:
            osz = (H * int(rng.choice([1, 2])), W * int(rng.choice([2, 4, 8])))
        elif kind == 2:
            osz = (max(1, H // 2), max(1, W // 2))
        else:
            osz = (H, W)
        ac = bool(rng.integers(0, 2))
        layout = LAYOUTS[int(rng.integers(0, 2))]
        dtype = (F32, F64)[int(rng.integers(0, 2))]
        sh = sw = None
        if not ac and rng.integers(0, 4) == 0:
            sh, sw = osz[0] / H + rng.uniform(0, 0.9 / H), osz[1] / W + rng.uniform(0, 0.9 / W)
            if int(np.floor(H * sh)) != osz[0] or int(np.floor(W * sw)) != osz[1]:
                sh = sw = None
        x = rng.standard_normal((N, C, H, W)).astype(dtype)
        if rng.integers(0, 5) == 0:
            x.flat[rng.integers(0, x.size, 3)] = [np.inf, -np.inf, np.nan]
        y = run(x, osz, ac, sh, sw, layout, "local-task")
        same_bits(y, torch_out(x, osz, ac, sh, sw, layout), f"{(N, C, H, W)}->{osz}/ac{int(ac)}/{layout}/{dtype}/{sh},{sw}")
