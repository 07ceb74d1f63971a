"""The main job (aclnn-iree demo): dense stereo on the Middlebury Motorcycle pair.

Hand-computed cases for the metrics, the occlusion mask and the left-right fill; the
--quick job against looser bounds than the full job's targets (README's quick start);
our backward and PyTorch's give the same estimate; the files exist and parse.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from aclnn_iree.tools import stereo as S

INF = np.inf


def test_metrics_hand_computed():
    truth = np.array([[1.0, 2.0, INF], [10.0, 0.0, 5.0]])
    est = np.array([[1.5, 2.0, 99.0], [4.0, 4.5, 5.0]])
    m = S.disparity_metrics(est, truth)
    # errors over the 5 finite pixels: 0.5, 0, 6, 4.5, 0 -> mean 2.2; off by more than 4: 6 and 4.5
    assert m == {"epe": pytest.approx(2.2), "bad4_percent": pytest.approx(40.0), "pixels": 5}
    mask = np.array([[True, True, True], [False, True, True]])
    assert S.disparity_metrics(est, truth, mask) == {"epe": pytest.approx(5.0 / 4), "bad4_percent": 25.0, "pixels": 4}
    assert S.disparity_metrics(truth, truth)["epe"] == 0.0
    with pytest.raises(ValueError, match="no pixel"):
        S.disparity_metrics(est, np.full_like(truth, INF))
    with pytest.raises(ValueError, match="shape"):
        S.disparity_metrics(est[:, :2], truth)


def test_exactly_four_pixels_off_is_not_bad():
    """Middlebury's bad 4.0 counts errors above 4, not equal to it."""
    m = S.disparity_metrics(np.array([[4.0, 4.0 + 1e-9]]), np.zeros((1, 2)))
    assert m["bad4_percent"] == 50.0


def test_nonoccluded_mask_hand_computed():
    # one row: a surface of disparity 1 with a closer object (disparity 3) at x = 4, 5;
    # x = 3 (d=1) lands on 2, as does x = 5 (d=3): x = 3 is hidden; x = 4 (d=3) lands on 1,
    # where x = 2 (d=1) also lands: x = 2 is hidden.  x = 0 lands outside the right image.
    truth = np.array([[1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 1.0, INF]])
    want = np.array([[False, True, False, False, True, True, True, False]])
    np.testing.assert_array_equal(S.nonoccluded_mask(truth), want)


def test_lr_consistency_fill_takes_the_background():
    left = np.array([[2.0, 2.0, 5.0, 5.0, 5.0, 2.0, 2.0, 2.0]])
    right = left.copy()  # agrees wherever x - d lands on the same value
    right[0, 0] = 2.0
    filled, rejected = S.lr_consistency_fill(left, right, threshold=1.0)
    # x=0..4 land left of the image (x - d < 0); x=5 and x=6 land on 3 and 4 (right's 5 vs
    # their 2: rejected); x=7 lands on 5 (2 vs 2: kept)
    assert rejected.tolist() == [[True] * 7 + [False]]
    # each rejected pixel takes the smaller of the nearest kept disparities: only x=7's (2.0)
    np.testing.assert_array_equal(filled, [[2.0] * 8])


def test_baselines_are_the_zero_and_the_median():
    truth = np.array([[1.0, 2.0, 9.0, INF]])
    b = S.baselines(truth)
    assert b["zero"]["epe"] == pytest.approx(4.0)
    assert b["best_constant"]["disparity"] == 2.0 and b["best_constant"]["epe"] == pytest.approx(8.0 / 3)


def _composed_data_term(torch, a, b, weights, eps):
    """The data term by plain autograd ops: the reference of the fused Function."""
    return ((((a - b) ** 2 + eps ** 2) ** 0.25) * weights.view(1, -1, 1, 1)).sum(1, keepdim=True)


def test_robust_data_term_against_the_composed_formula():
    """The fused data term (one autograd Function): gradcheck in float64 of both inputs;
    its float64 value and gradients equal the composed formula's to float64 rounding; its
    float32 ones are within float32 rounding of them (a sum of C terms of a few ulps each)."""
    torch = pytest.importorskip("torch")
    term = S._robust_data_term(torch)
    g = torch.Generator().manual_seed(7)
    n, c, h, w = 2, 5, 3, 4
    a, b = (0.1 * torch.randn(n, c, h, w, generator=g, dtype=torch.float64) for _ in range(2))
    a[0, 0, 0, 0] = b[0, 0, 0, 0]  # x = 0: the penalty's minimum, where its slope is 0
    weights = torch.rand(c, generator=g, dtype=torch.float64)
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: term.apply(a, b, weights, 0.01), (a, b))
    seed = torch.randn(n, 1, h, w, generator=g, dtype=torch.float64)
    ref = _composed_data_term(torch, a, b, weights, 0.01)
    ref_grads = torch.autograd.grad((ref * seed).sum(), (a, b))
    for dtype, rtol in ((torch.float64, 1e-13), (torch.float32, 8 * c * torch.finfo(torch.float32).eps)):
        a1, b1 = (x.detach().to(dtype).requires_grad_() for x in (a, b))
        out = term.apply(a1, b1, weights.to(dtype), 0.01)
        grads = torch.autograd.grad((out * seed.to(dtype)).sum(), (a1, b1))
        assert out.dtype == dtype and out.shape == (n, 1, h, w)
        torch.testing.assert_close(out.double(), ref.detach(), rtol=rtol, atol=0)
        for got, want in zip(grads, ref_grads):
            scale = want.abs().max().item()  # gradients cross zero: bound against their scale
            torch.testing.assert_close(got.double(), want, rtol=0, atol=rtol * scale)
    a2 = a.detach().requires_grad_()
    out = term.apply(a2, b.detach(), weights, 0.01)  # b without requires_grad: no gradient for it
    assert torch.autograd.grad(out.sum(), a2)[0].shape == a2.shape


def test_adam_is_torch_optim_adam_with_the_linear_decay():
    """The job's optimiser (PyTorch's functional Adam over its own state) gives the bits of
    torch.optim.Adam with a LambdaLR of the same decay, over two parameters and 12 steps."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    target = [torch.randn(2, 1, 3, 4, generator=g), torch.randn(2, 1, 5, 7, generator=g)]
    lr, lr_end, n = 0.3, 0.2, 12

    def run(make_step):
        params = [torch.zeros_like(t, requires_grad=True) for t in target]
        step, zero = make_step(params)
        for i in range(n):
            zero()
            sum(((p - t) ** 4).sum() for p, t in zip(params, target)).backward()
            step(i)
        return [p.detach() for p in params]

    def ours(params):
        opt = S._Adam(torch, params)
        return (lambda i: opt.step(S._linear_decay(lr, lr_end, i, n))), opt.zero_grad

    def pytorchs(params):
        opt = torch.optim.Adam(params, lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - (1.0 - lr_end) * i / (n - 1))
        return (lambda i: (opt.step(), sched.step())), (lambda: opt.zero_grad(set_to_none=True))

    for got, want in zip(run(ours), run(pytorchs)):
        assert torch.equal(got, want)
        assert not torch.equal(got, torch.zeros_like(got))


def test_the_job_does_not_import_dynamo():
    """torch.optim.Adam's step imports torch._dynamo (~2 s on 2 cores, a fifth of the quick
    demo); the job's optimiser must not.  A fresh process runs a few steps of the job."""
    pytest.importorskip("torch")
    pytest.importorskip("skimage")
    import subprocess
    import sys
    code = ("import sys, dataclasses\n"
            "from aclnn_iree.tools import stereo as S\n"
            "left, right, _ = S.load_pair()\n"
            "cfg = dataclasses.replace(S.StereoConfig.quick(), levels=(8,), steps=(3,), lr=(0.5,), grids=(16, 8))\n"
            "run = S.estimate_disparity(left, right, cfg, 'torch', progress=False)\n"
            "assert len(run['losses']) == 3, run['losses']\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_jobs_side_by_side_equal_the_jobs_alone():
    """--backward both runs the two jobs a step each in turn (estimate_side_by_side): each
    gives the bits it gives alone, and its seconds count its own steps only."""
    pytest.importorskip("torch")
    pytest.importorskip("skimage")
    import dataclasses
    import time
    left, right, _ = S.load_pair()
    cfg = dataclasses.replace(S.StereoConfig.quick(), levels=(8, 4), steps=(3, 2), lr=(0.5, 0.3), grids=(16, 8, 4))
    t = time.perf_counter()
    both = S.estimate_side_by_side(left, right, cfg, ("ours", "torch"), progress=False)
    wall = time.perf_counter() - t
    for name in ("ours", "torch"):
        alone = S.estimate_disparity(left, right, cfg, name, progress=False)
        assert np.array_equal(alone["disparity"], both[name]["disparity"]), name
        assert alone["losses"] == both[name]["losses"] and len(alone["losses"]) == 5
    assert 0 < both["ours"]["seconds"] and 0 < both["torch"]["seconds"]
    assert both["ours"]["seconds"] + both["torch"]["seconds"] <= wall
    with pytest.raises(ValueError, match="at least one backend"):
        S.estimate_side_by_side(left, right, cfg, (), progress=False)
    one = S.estimate_side_by_side(left, right, cfg, "torch", progress=False)  # a name, not its letters
    assert list(one) == ["torch"] and np.array_equal(one["torch"]["disparity"], both["torch"]["disparity"])
    gen = S.estimate_side_by_side(left, right, cfg, (b for b in ("torch", "torch")), progress=False)
    assert list(gen) == ["torch"]


@pytest.fixture(scope="module")
def quick_job(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("skimage")
    pytest.importorskip("matplotlib")
    from aclnn_iree.tools.stereo_demo import run_stereo_demo
    out = tmp_path_factory.mktemp("demo")
    lines = []
    results = run_stereo_demo(str(out), quick=True, backward="both", progress=False, log=lines.append)
    return out, results, "\n".join(lines)


# The full job's targets (500 x 741, all pixels with ground truth) are EPE <= 2.4 px and
# <= 13 % off by more than 4 px (README); the quick job at a quarter of the resolution
# must stay within these looser bounds.
QUICK_EPE, QUICK_BAD4 = 3.0, 16.0


def test_quick_job_meets_its_bounds_and_beats_the_baselines(quick_job):
    _, results, _ = quick_job
    for name, run in results["runs"].items():
        m = run["metrics"]["all"]
        assert m["epe"] <= QUICK_EPE and m["bad4_percent"] <= QUICK_BAD4, (name, m)
        assert m["epe"] < results["baselines"]["best_constant"]["all"]["epe"] / 4
        assert run["metrics"]["nonoccluded"]["epe"] < m["epe"]
        assert run["init_disparity_px"][0] != 0  # the data-driven start moved off zero


def test_our_backward_and_pytorchs_give_the_same_estimate(quick_job):
    """Same forward, same data, same steps: only the rounding of the backward sums differs."""
    _, results, _ = quick_job
    assert results["agreement"]["epe_difference"] < 0.05
    o, t = (results["runs"][k]["losses"] for k in ("ours", "torch"))
    np.testing.assert_allclose(o, t, rtol=2e-3)


def test_quick_job_writes_its_files_and_summary(quick_job):
    out, results, console = quick_job
    d = np.load(out / "disparity_full.npy")
    assert d.shape == (500, 741) and d.dtype == np.float32 and np.isfinite(d).all()
    _, _, truth = S.load_pair()
    assert S.disparity_metrics(d, truth)["epe"] == pytest.approx(results["runs"]["ours"]["metrics"]["all"]["epe"])
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["runs"]) == {"ours", "torch"} and "speedup" in saved and saved["baselines"]["zero"]["all"]
    from PIL import Image
    with Image.open(out / "stereo.png") as im:
        assert im.size[0] > 1000 and im.size[1] > 500
    assert "baseline: best constant" in console and "our kernels vs PyTorch's" in console


def test_openmp_spin_is_limited_only_where_nobody_chose():
    """The demo limits libgomp's spinning unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY,
    or PyTorch (and so libgomp) is already loaded, where it would have no effect."""
    from aclnn_iree.tools.stereo_demo import OPENMP_SPINCOUNT, limit_openmp_spin
    env = {}
    assert limit_openmp_spin(env, loaded=False) == {"GOMP_SPINCOUNT": OPENMP_SPINCOUNT, "OMP_WAIT_POLICY": None,
                                                    "set_by_demo": True}
    assert env == {"GOMP_SPINCOUNT": OPENMP_SPINCOUNT}
    for chosen in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "PASSIVE"}):
        env = dict(chosen)
        assert limit_openmp_spin(env, loaded=False)["set_by_demo"] is False and env == chosen
    env = {}
    assert limit_openmp_spin(env, loaded=True)["set_by_demo"] is False and env == {}


def test_demo_records_the_openmp_setting(quick_job):
    _, results, _ = quick_job
    assert set(results["openmp"]) >= {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"}


def test_figure_leaves_pyplot_and_the_backend_alone(tmp_path, monkeypatch):
    """The figure is a standalone matplotlib Figure: drawing it neither needs pyplot nor
    switches the caller's backend (a notebook calling run_stereo_demo keeps its own)."""
    matplotlib = pytest.importorskip("matplotlib")
    pytest.importorskip("PIL")
    from aclnn_iree.tools.stereo_demo import _figure

    def refuse(*_a, **_k):
        raise AssertionError("the figure switched matplotlib's backend")
    monkeypatch.setattr(matplotlib, "use", refuse)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.pyplot", None)  # importing it raises
    truth = np.full((6, 8), 3.0)
    truth[0, 0] = INF
    run = {"disparity": np.full((6, 8), 2.5, np.float32), "rejected": np.zeros((6, 8), bool),
           "losses": [1.0, 0.5, 0.25], "level_starts": [0, 2], "level_fractions": [4, 2]}
    metrics = {"all": {"epe": 0.5, "bad4_percent": 0.0}}
    _figure(tmp_path / "f.png", np.zeros((6, 8, 3), np.uint8), truth, run,
            {"runs": {"ours": {"metrics": metrics, "losses": run["losses"]}}})
    from PIL import Image
    with Image.open(tmp_path / "f.png") as im:
        assert im.size[0] > 1000


@pytest.mark.parametrize("which", ["stereo", "photo"])
def test_demo_refuses_a_file_as_its_output_directory(tmp_path, which):
    """Called from Python with a file as the output directory, both demos say so before any
    work (the CLI checks the same first), rather than failing in makedirs with 'File exists'."""
    from aclnn_iree.tools import demo, stereo_demo
    target = tmp_path / "a_file"
    target.write_text("keep me")
    run = stereo_demo.run_stereo_demo if which == "stereo" else demo.run_demo
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        run(out_dir=str(target), quick=True, log=lambda *a: None)
    assert target.read_text() == "keep me"
