"""The float64 NumPy reference (aclnn_iree.ops.reference) against PyTorch CPU.

PyTorch is the oracle (docs/semantics.md#pytorch-is-the-reference); both sides compute in float64, so the
tolerance is ~1e-10 relative to the magnitude of the data.
"""

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from aclnn_iree.ops import reference as ref  # noqa: E402

RTOL = 1e-10

MODES = [ref.INTERP_BILINEAR, ref.INTERP_NEAREST, ref.INTERP_BICUBIC]
PADS = [ref.PAD_ZEROS, ref.PAD_BORDER, ref.PAD_REFLECTION]


def assert_close(actual, expected, scale=None):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape
    if scale is None:
        scale = max(1.0, float(np.max(np.abs(expected))) if expected.size else 1.0)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * scale)


# --------------------------------------------------------------------------
# grid sampler
# --------------------------------------------------------------------------
def _special_coords(size, align_corners):
    """-1, +1, 0, every pixel centre and every pixel edge (nearest ties)."""
    k = np.arange(size, dtype=np.float64)
    if align_corners:
        centres = -1 + 2 * k / max(size - 1, 1)
        edges = -1 + (2 * k + 1) / max(size - 1, 1)
    else:
        centres = (2 * k + 1) / size - 1
        edges = 2 * (k + 1) / size - 1
    return np.concatenate([[-1.0, 1.0, 0.0], centres, edges])


def _make_grid(rng, N, Ho, Wo, H, W, align_corners):
    grid = rng.uniform(-1.3, 1.3, size=(N, Ho, Wo, 2))
    sx = _special_coords(W, align_corners)
    sy = _special_coords(H, align_corners)
    flat = grid.reshape(-1, 2)
    m = flat.shape[0]
    # about half of the points get special x and/or y values
    sel = rng.choice(m, size=m // 2, replace=False)
    flat[sel[: len(sel) // 2], 0] = rng.choice(sx, size=len(sel) // 2)
    flat[sel[len(sel) // 4:], 1] = rng.choice(sy, size=len(sel) - len(sel) // 4)
    return flat.reshape(N, Ho, Wo, 2)


# (N, C, H, W, Ho, Wo); the power-of-two friendly shapes make pixel centres
# and edges exact in binary (align_corners False: H, W powers of two; True:
# H-1, W-1 powers of two), so border gradients and nearest ties are exact.
SHAPES = {
    False: [(2, 3, 4, 8, 5, 6), (1, 2, 5, 7, 3, 9), (2, 1, 1, 6, 2, 3)],
    True: [(2, 3, 5, 9, 6, 4), (1, 2, 6, 4, 7, 3), (1, 2, 3, 1, 2, 5)],
}


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", PADS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sampler_backward_matches_torch(mode, padding_mode, align_corners):
    rng = np.random.default_rng(1000 + 100 * mode + 10 * padding_mode + align_corners)
    for N, C, H, W, Ho, Wo in SHAPES[align_corners]:
        inp = rng.standard_normal((N, C, H, W))
        go = rng.standard_normal((N, C, Ho, Wo))
        grid = _make_grid(rng, N, Ho, Wo, H, W, align_corners)
        gi_t, gg_t = torch.ops.aten.grid_sampler_2d_backward(
            torch.from_numpy(go), torch.from_numpy(inp), torch.from_numpy(grid),
            mode, padding_mode, align_corners, [True, True])
        gi, gg = ref.grid_sampler_2d_backward(go, inp, grid, mode, padding_mode, align_corners)
        assert gi.dtype == np.float64 and gg.dtype == np.float64
        assert_close(gi, gi_t.numpy())
        # grad_grid sums products over C and taps: scale by that magnitude
        gscale = max(1.0, float(np.abs(gg_t.numpy()).max()), C * max(H, W) * 4.0)
        assert_close(gg, gg_t.numpy(), scale=gscale)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", PADS)
@pytest.mark.parametrize("mode", MODES)
def test_grid_sampler_forward_matches_torch(mode, padding_mode, align_corners):
    rng = np.random.default_rng(2000 + 100 * mode + 10 * padding_mode + align_corners)
    for N, C, H, W, Ho, Wo in SHAPES[align_corners]:
        inp = rng.standard_normal((N, C, H, W))
        grid = _make_grid(rng, N, Ho, Wo, H, W, align_corners)
        out_t = torch.ops.aten.grid_sampler_2d(
            torch.from_numpy(inp), torch.from_numpy(grid), mode, padding_mode, align_corners)
        out = ref.grid_sampler_2d(inp, grid, mode, padding_mode, align_corners)
        assert out.dtype == np.float64
        assert_close(out, out_t.numpy())


def test_grid_sampler_backward_medium_size_fast():
    import time
    rng = np.random.default_rng(7)
    N, C, H, W = 2, 8, 32, 32
    inp = rng.standard_normal((N, C, H, W))
    go = rng.standard_normal((N, C, H, W))
    grid = rng.uniform(-1.3, 1.3, size=(N, H, W, 2))
    for mode in MODES:
        t0 = time.perf_counter()
        gi, gg = ref.grid_sampler_2d_backward(go, inp, grid, mode, ref.PAD_REFLECTION, False)
        assert time.perf_counter() - t0 < 1.0
        gi_t, gg_t = torch.ops.aten.grid_sampler_2d_backward(
            torch.from_numpy(go), torch.from_numpy(inp), torch.from_numpy(grid),
            mode, ref.PAD_REFLECTION, False, [True, True])
        assert_close(gi, gi_t.numpy())
        assert_close(gg, gg_t.numpy(), scale=C * 32 * 4.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding_mode", PADS)
def test_grid_sampler_adjoint(mode, padding_mode):
    """<forward(x), g> == <x, grad_input> (the forward is linear in x)."""
    rng = np.random.default_rng(3 + mode * 3 + padding_mode)
    inp = rng.standard_normal((2, 3, 5, 6))
    go = rng.standard_normal((2, 3, 4, 7))
    grid = rng.uniform(-1.3, 1.3, size=(2, 4, 7, 2))
    for ac in (False, True):
        out = ref.grid_sampler_2d(inp, grid, mode, padding_mode, ac)
        gi, _ = ref.grid_sampler_2d_backward(go, inp, grid, mode, padding_mode, ac)
        assert math.isclose(np.sum(out * go), np.sum(inp * gi), rel_tol=1e-11, abs_tol=1e-11)


def test_nearest_rounds_half_to_even():
    # W = 4, align_corners False: x = -0.5 -> ix = 0.5 -> pixel 0; x = 0 -> ix = 1.5 -> 2
    inp = np.arange(4.0).reshape(1, 1, 1, 4)
    grid = np.array([[[[-0.5, 0.0], [0.0, 0.0], [0.5, 0.0]]]])  # ix 0.5, 1.5, 2.5
    out = ref.grid_sampler_2d(inp, grid, ref.INTERP_NEAREST, ref.PAD_ZEROS, False)
    np.testing.assert_array_equal(out.ravel(), [0.0, 2.0, 2.0])


# Non-finite grid values: not compared with torch (which segfaults on NaN with
# border / reflection); the expected values are this project's definitions.
NAN, INF = float("nan"), float("inf")
NONFINITE_CASES = [
    # (x, padding, expected grad_input)
    (NAN, ref.PAD_BORDER, [1.0, 0.0]),
    (NAN, ref.PAD_REFLECTION, [1.0, 0.0]),
    (INF, ref.PAD_BORDER, [0.0, 1.0]),
    (-INF, ref.PAD_BORDER, [1.0, 0.0]),
    (INF, ref.PAD_REFLECTION, [1.0, 0.0]),
    (-INF, ref.PAD_REFLECTION, [1.0, 0.0]),
    (NAN, ref.PAD_ZEROS, [0.0, 0.0]),
    (INF, ref.PAD_ZEROS, [0.0, 0.0]),
    (-INF, ref.PAD_ZEROS, [0.0, 0.0]),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("x,padding_mode,expected", NONFINITE_CASES)
def test_nonfinite_grid_known_cases(x, padding_mode, expected, align_corners, mode):
    inp = np.array([10.0, 20.0]).reshape(1, 1, 1, 2)
    grid = np.array([x, 0.0]).reshape(1, 1, 1, 2)
    go = np.ones((1, 1, 1, 1))
    gi, gg = ref.grid_sampler_2d_backward(go, inp, grid, mode, padding_mode, align_corners)
    np.testing.assert_array_equal(gi.ravel(), expected)
    np.testing.assert_array_equal(gg.ravel(), [0.0, 0.0])
    out = ref.grid_sampler_2d(inp, grid, mode, padding_mode, align_corners)
    np.testing.assert_array_equal(out.ravel(), [np.dot(expected, [10.0, 20.0])])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding_mode", PADS)
def test_extreme_grid_values_never_crash(mode, padding_mode):
    vals = [NAN, INF, -INF, 1e38, -1e38, 1e300, -1e300, 3e9, -3e9, 1.0, -1.0]
    grid = np.array(list(itertools.product(vals, vals)), dtype=np.float64).reshape(1, 11, 11, 2)
    inp = np.arange(15.0).reshape(1, 1, 3, 5)
    go = np.ones((1, 1, 11, 11))
    for ac in (False, True):
        gi, gg = ref.grid_sampler_2d_backward(go, inp, grid, mode, padding_mode, ac)
        out = ref.grid_sampler_2d(inp, grid, mode, padding_mode, ac)
        assert np.all(np.isfinite(gi)) and np.all(np.isfinite(gg)) and np.all(np.isfinite(out))
        # each grid point contributes total weight 1 (or 0 under zeros padding)
        assert gi.sum() <= 121 + 1e-9
        if padding_mode != ref.PAD_ZEROS and mode != ref.INTERP_BICUBIC:
            assert math.isclose(gi.sum(), 121.0, rel_tol=1e-12)
        # the non-finite coordinates have zero grid gradient
        nonfinite = ~np.isfinite(grid)
        assert np.all(gg[nonfinite] == 0.0)


def test_zeros_padding_far_coordinates_are_out_of_bounds():
    inp = np.ones((1, 1, 2, 2))
    grid = np.array([[[[1e38, 0.0], [-1e38, 0.0], [0.0, 1e30], [5.0, 5.0]]]])
    go = np.ones((1, 1, 1, 4))
    for mode in MODES:
        gi, gg = ref.grid_sampler_2d_backward(go, inp, grid, mode, ref.PAD_ZEROS, False)
        assert np.all(gi == 0) and np.all(gg == 0)


@pytest.mark.parametrize("align_corners", [False, True])
def test_reflection_sign_of_huge_coordinates_is_an_exact_count(align_corners):
    """Bilinear, reflection, float64 coordinates up to 1e300: the sign of the reference's
    grad_grid equals an exact reflection count with (g + 1) * W - 1 rounded once (the
    kernels' fused multiply-add; test_grid_sampler's oracle).  Rounded twice, the
    reference's sign differed at ~1e30 (found by an attack: grid (1e30, 0.3) on a 3 x 3
    input)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from grid_sampler_2d_backward.test_grid_sampler import _exact_reflected_dgrid_x
    rng = np.random.default_rng(21)
    vals = 10.0 ** rng.uniform(0, 300, 400) * rng.choice([-1, 1], 400)
    vals = np.concatenate([[1e30, -1e30, 1e16, -1e16, 3.6136936e16], vals])
    W = 7
    x = np.tile(np.arange(W, dtype=np.float64), (5, 1)).reshape(1, 1, 5, W)
    grid = np.stack([vals, np.zeros_like(vals)], -1).reshape(1, 1, -1, 2)
    go = np.ones((1, 1, 1, len(vals)))
    _, gg = ref.grid_sampler_2d_backward(go, x, grid, ref.INTERP_BILINEAR, ref.PAD_REFLECTION, align_corners)
    want = np.array([_exact_reflected_dgrid_x(v, W, align_corners, np.float64) for v in vals])
    wrong = np.nonzero(gg[0, 0, :, 0] != want)[0]
    assert len(wrong) == 0, [(vals[i], gg[0, 0, i, 0], want[i]) for i in wrong[:5]]
    assert np.count_nonzero(want) > len(vals) // 8  # not vacuous


# --------------------------------------------------------------------------
# upsample bilinear 2d
# --------------------------------------------------------------------------
# (in_h, in_w, out_h, out_w, scales_h, scales_w)
UPSAMPLE_CASES = [
    (4, 5, 8, 10, None, None),       # up x2
    (4, 5, 8, 10, 2.0, 2.0),
    (9, 7, 4, 3, None, None),        # down
    (9, 7, 4, 3, 0.45, 0.5),
    (5, 7, 8, 11, None, None),       # non-integer ratio
    (5, 7, 8, 11, 1.7, 1.6),         # scales not consistent with the sizes
    (6, 13, 4, 5, 0.7, 0.4),
    (5, 6, 1, 1, None, None),        # out size 1
    (5, 6, 1, 1, 0.25, 0.2),
    (1, 1, 4, 3, None, None),        # in size 1
    (1, 1, 4, 3, 4.0, 3.0),
    (1, 6, 3, 1, None, None),
    (5, 7, 5, 7, None, None),        # in == out: identity
    (5, 7, 5, 7, 2.0, 0.5),          # in == out with a scale: still identity
    (5, 7, 5, 9, 3.0, None),         # one axis unchanged
    (3, 10, 2, 3, None, 1 / (7 - 6e-8)),  # float32 floorf quirk in W
    (12, 17, 31, 29, None, None),
    (2, 2, 7, 5, 0.0, -1.0),         # scale <= 0 means "not given"
]


def _torch_scale(s):
    return None if s is None else float(s)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("case", UPSAMPLE_CASES)
def test_upsample_backward_matches_torch(case, align_corners):
    in_h, in_w, out_h, out_w, sh, sw = case
    rng = np.random.default_rng(in_h * 1000 + in_w * 100 + out_h * 10 + out_w)
    N, C = 2, 3
    go = rng.standard_normal((N, C, out_h, out_w))
    gi_t = torch.ops.aten.upsample_bilinear2d_backward(
        torch.from_numpy(go), [out_h, out_w], [N, C, in_h, in_w], align_corners,
        _torch_scale(sh), _torch_scale(sw))
    gi = ref.upsample_bilinear2d_backward(
        go, (out_h, out_w), (N, C, in_h, in_w), align_corners, sh, sw)
    assert gi.dtype == np.float64
    assert_close(gi, gi_t.numpy(), scale=max(1.0, float(np.abs(go).sum(axis=(2, 3)).max())))


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("case", UPSAMPLE_CASES)
def test_upsample_forward_matches_torch(case, align_corners):
    in_h, in_w, out_h, out_w, sh, sw = case
    rng = np.random.default_rng(in_h * 1000 + in_w * 100 + out_h * 10 + out_w + 1)
    x = rng.standard_normal((2, 3, in_h, in_w))
    y_t = torch.ops.aten.upsample_bilinear2d(
        torch.from_numpy(x), [out_h, out_w], align_corners, _torch_scale(sh), _torch_scale(sw))
    y = ref.upsample_bilinear2d(x, (out_h, out_w), align_corners, sh, sw)
    assert_close(y, y_t.numpy())


def test_upsample_identity_when_sizes_equal():
    g = np.random.default_rng(0).standard_normal((1, 2, 4, 6))
    for ac in (False, True):
        for s in (None, 2.0, 0.5):
            gi = ref.upsample_bilinear2d_backward(g, (4, 6), (1, 2, 4, 6), ac, s, s)
            np.testing.assert_array_equal(gi, g)


def test_area_pixel_compute_scale():
    assert ref.area_pixel_compute_scale(5, 1, True) == 0.0
    assert ref.area_pixel_compute_scale(5, 3, True, 9.0) == 2.0
    assert ref.area_pixel_compute_scale(5, 1, False) == 5.0
    assert ref.area_pixel_compute_scale(5, 10, False) == 0.5
    assert ref.area_pixel_compute_scale(5, 10, False, 4.0) == 0.25
    assert ref.area_pixel_compute_scale(5, 10, False, 0.0) == 0.5
    assert ref.area_pixel_compute_scale(5, 10, False, -2.0) == 0.5


def test_upsample_floorf_quirk_explicit():
    # src = 2.99999997 rounds to 3.0 in float32: PyTorch puts the whole weight on 3
    s = 1 / (7 - 6e-8)
    g = np.zeros((1, 1, 1, 3))
    g[..., 0] = 1.0
    gi = ref.upsample_bilinear2d_backward(g, (1, 3), (1, 1, 1, 10), False, None, s)
    np.testing.assert_array_equal(gi.ravel(), np.eye(10)[3])
