"""The demo's two tasks at reduced size: they converge to the known answers (well under a minute)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("skimage", reason="the demo photo comes from scikit-image (the demo extra)")

from aclnn_iree import cli  # noqa: E402
from aclnn_iree.tools import demo
from aclnn_iree.ops import reference as R  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def photo64():
    return demo.load_photo(64)


def test_photo_is_the_astronaut():
    p = demo.load_photo(32)
    assert p.shape == (32, 32) and p.dtype == np.float32 and 0 <= p.min() < p.max() <= 1
    assert "NASA" in demo.PHOTO_CREDIT and "public domain" in demo.PHOTO_CREDIT
    assert "astronaut" in demo.__doc__ and "public domain" in demo.__doc__


@pytest.mark.filterwarnings("ignore:Since version 1.3.0, affine_grid behavior has changed")
def test_affine_grid_matches_torch():
    torch = pytest.importorskip("torch")
    theta = np.stack([demo.affine_theta(10, 1.05, (0.05, -0.04)), demo.affine_theta(-3, 0.9, (0.1, 0.2))])
    for ac in (False, True):
        for size in ((2, 1, 5, 7), (2, 3, 1, 4)):
            ours = demo.affine_grid(theta, size, align_corners=ac)
            ref = torch.nn.functional.affine_grid(torch.from_numpy(theta), list(size), align_corners=ac).numpy()
            np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


def test_registration_gradient_matches_finite_differences(photo64):
    """The theta gradient (our kernel + chain rule) against central differences of the float64 loss."""
    img = demo._blur(photo64.astype(np.float64), 1.5)[::2, ::2]
    target = demo._warp(img, demo.affine_theta(4, 1.02, (0.03, -0.02)))
    theta = demo.affine_theta(1, 1.0, (0.0, 0.01))
    loss, grad = demo._loss_and_grad(theta, img, target, "local-task")
    fd = np.zeros_like(theta)
    h = 1e-5
    for r in range(2):
        for k in range(3):
            e = np.zeros_like(theta)
            e[r, k] = h
            fd[r, k] = (demo._loss_and_grad(theta + e, img, target, "local-task")[0]
                        - demo._loss_and_grad(theta - e, img, target, "local-task")[0]) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=2e-3, atol=1e-4 * np.abs(fd).max())


def test_registration_recovers_theta(photo64):
    theta_true = demo.affine_theta(10.0, 1.05, (0.05, -0.04))
    target = demo._warp(photo64.astype(np.float64), theta_true)
    res = demo.register_affine(photo64, target, steps=100, log=None)
    err = np.abs(res["theta"] - theta_true).max()
    assert err < demo.REGISTRATION_BOUND, f"max parameter error {err:.2e}"
    assert res["final_loss"] < 1e-3 * res["loss"][0]


def test_axis_matrix_is_the_reference_interpolation():
    for n_in, n_out in ((4, 16), (8, 32), (5, 13), (7, 3)):
        A = demo.axis_matrix(n_in, n_out)
        x = np.random.default_rng(0).standard_normal((1, 1, n_in, 1))
        np.testing.assert_allclose(A @ x[0, 0, :, 0], R.upsample_bilinear2d(x, (n_out, 1), False)[0, 0, :, 0],
                                   atol=1e-14)


def test_lowres_descends_monotonically_to_the_optimum(photo64):
    res = demo.learn_lowres(photo64, factor=4, iters=200, log=None)
    assert res["monotone"], "loss rose at some iteration"
    assert len(res["loss"]) > 10
    assert res["relative_gap"] < demo.LOWRES_GAP_BOUND, res["relative_gap"]
    # L is an upper bound of the largest eigenvalue the power iteration (through our kernel) finds
    assert res["power_iteration"] <= res["L"] * (1 + 1e-9) <= res["holder_bound"] * (1 + 1e-9)
    assert res["power_iteration"] > 0.9 * res["L"]
    assert res["naive_loss"] > res["loss"][-1]


def test_lowres_crop_matches_lstsq(photo64):
    res = demo.lowres_crop_check(photo64, crop=32, factor=4, iters=300, log=None)
    assert res["monotone"]
    assert res["relative_gap"] < demo.LOWRES_GAP_BOUND, res["relative_gap"]
    assert res["max_abs_diff"] < 1e-3


def test_cli_photo_demo_quick_writes_titled_pngs(tmp_path, capsys):
    assert cli.main(["demo", "--photo", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "NASA" in out and "public domain" in out
    assert "max |theta - theta_true|" in out and "loss fell monotonically: True" in out
    for name in ("photo", "registration_target", "registration_recovered", "registration_diff_before",
                 "registration_diff_after", "lowres_learned", "lowres_learned_upsampled"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "loss_curves.png").stat().st_size > 0
    except ImportError:
        assert "loss-curve plot is skipped" in out
    from PIL import Image
    with Image.open(tmp_path / "photo.png") as im:  # the 128 x 128 photo under its title band
        w, h = im.size
        assert w >= 128 and h > 128
        band = np.asarray(im)[: h - 128]
        assert (band < 128).any() and (band == 255).mean() > 0.5  # dark text on white
