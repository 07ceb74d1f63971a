"""The demo: both backward kernels driving optimisations on a real photograph.

The photograph is scikit-image's ``skimage.data.astronaut()``: astronaut
Eileen Collins, a NASA photograph in the public domain, bundled with
scikit-image (install the ``demo`` extra: ``pip install aclnn-iree[demo]``).
It is converted to grayscale float32 and resized (128x128 with ``quick``,
256x256 otherwise).

a. Image registration (grid_sampler_2d_backward).  The photo is warped with a
   known affine transform (10 degree rotation, 5 % scale, a shift of 0.05 /
   -0.04 in normalised coordinates) by the float64 forward
   ``reference.grid_sampler_2d`` (bilinear, border padding, align_corners=False)
   on an ``affine_grid`` (as torch.nn.functional.affine_grid).  The 6 affine
   parameters are then recovered from the warped image alone by Adam on the
   mean squared difference between grid_sample(photo, affine_grid(theta)) and
   the target, coarse to fine (blurred, block-averaged levels first).  The
   gradient through the grid comes from OUR kernel,
   ``aclnn_iree.grid_sampler_2d_backward(..., interpolation_mode=0,
   padding_mode=1, align_corners=False, output_mask=(False, True))``, and the
   chain rule to theta (d theta[r, k] = sum over pixels of dgrid[., r] * base[., k]).

b. A learned low-resolution image (upsample_bilinear2d_backward).  The image x
   at 1/4 size whose bilinear upsampling (reference.upsample_bilinear2d,
   align_corners=False) best matches the photo in least squares, found by
   gradient descent with the gradient A^T (A x - y) from OUR
   ``aclnn_iree.upsample_bilinear2d_backward`` and the step 1/L, L the
   Lipschitz constant of the gradient (exact, from the spectral norms of the
   two 1-D interpolation matrices; checked by a power iteration that runs
   through our kernel, and bounded by ||A||_1 ||A||_inf), so the loss falls
   monotonically.  The result is compared with the closed-form optimum of the
   whole image and, independently, with ``np.linalg.lstsq`` on a 32x32 crop
   using the explicit interpolation matrix built by applying the reference
   forward to unit vectors.

c. Before/after images and the loss curves are written as PNG files (Pillow;
   matplotlib for the curves when importable) into ``out_dir``.

``run_demo(out_dir, quick=False)`` returns a dict of the results; ``aclnn-iree
demo`` runs it.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from ..ops import reference as R

__all__ = ["PHOTO_CREDIT", "load_photo", "affine_grid", "affine_theta", "register_affine",
           "learn_lowres", "lowres_crop_check", "axis_matrix", "run_demo"]

PHOTO_CREDIT = ("skimage.data.astronaut(): astronaut Eileen Collins, a NASA photograph, public domain "
                "(bundled with scikit-image)")

REGISTRATION_BOUND = 1e-3   # max abs error of the 6 recovered affine parameters
LOWRES_GAP_BOUND = 1e-4     # relative loss gap to the least-squares optimum


def _log(log, *args):
    if log:
        log(" ".join(str(a) for a in args))


# ----------------------------------------------------------------------------- the photo
def load_photo(size: int = 256) -> np.ndarray:
    """``skimage.data.astronaut()`` (NASA, public domain) as a (size, size) grayscale float32 image in [0, 1]."""
    try:
        import skimage.color
        import skimage.data
        import skimage.transform
    except ImportError:  # pragma: no cover - depends on the environment
        from ..core.install import install_command
        raise ImportError(f"the demo needs scikit-image for its photo: {install_command('demo')}") from None
    gray = skimage.color.rgb2gray(skimage.data.astronaut())
    if gray.shape != (size, size):
        gray = skimage.transform.resize(gray, (size, size), anti_aliasing=True)
    return np.clip(gray, 0.0, 1.0).astype(np.float32)


# ----------------------------------------------------------------------------- affine grids
def _base_coords(n: int, align_corners: bool) -> np.ndarray:
    """torch.nn.functional.affine_grid's normalised pixel coordinates along one axis."""
    if n <= 1:
        return np.zeros(max(n, 0))
    r = np.linspace(-1.0, 1.0, n)
    return r if align_corners else r * (n - 1) / n


def affine_base(H: int, W: int, align_corners: bool = False) -> np.ndarray:
    """(H, W, 3): the homogeneous normalised coordinates (x, y, 1) of every output pixel."""
    xs, ys = _base_coords(W, align_corners), _base_coords(H, align_corners)
    base = np.empty((H, W, 3))
    base[..., 0] = xs[None, :]
    base[..., 1] = ys[:, None]
    base[..., 2] = 1.0
    return base


def affine_grid(theta, size, align_corners: bool = False) -> np.ndarray:
    """Sampling grid of torch.nn.functional.affine_grid: theta (N, 2, 3), size (N, C, H, W) -> (N, H, W, 2).

    grid[n, i, j] = theta[n] @ (x_j, y_i, 1), with x, y the normalised pixel
    centres (align_corners=False) or corners (True); float64.
    """
    theta = np.asarray(theta, dtype=np.float64).reshape(-1, 2, 3)
    N, _, H, W = size
    if theta.shape[0] != N:
        raise ValueError(f"theta has {theta.shape[0]} matrices for a batch of {N}")
    return np.einsum("hwk,nrk->nhwr", affine_base(H, W, align_corners), theta)


def affine_theta(angle_deg: float, scale: float, shift) -> np.ndarray:
    """The 2x3 matrix [s R(angle) | shift]: sample the input at scale * rotation of the output coordinates + shift."""
    a = math.radians(angle_deg)
    c, s = math.cos(a) * scale, math.sin(a) * scale
    return np.array([[c, -s, shift[0]], [s, c, shift[1]]])


def describe_theta(theta) -> dict:
    """Rotation (degrees), isotropic scale and shift of a 2x3 affine matrix (as made by affine_theta)."""
    t = np.asarray(theta, dtype=np.float64)
    return {"angle_deg": math.degrees(math.atan2(t[1, 0] - t[0, 1], t[0, 0] + t[1, 1])),
            "scale": math.sqrt(abs(np.linalg.det(t[:, :2]))), "shift": (float(t[0, 2]), float(t[1, 2]))}


def _warp(img: np.ndarray, theta) -> np.ndarray:
    """grid_sample(img, affine_grid(theta)), bilinear, border padding, align_corners=False (float64 reference)."""
    H, W = img.shape
    grid = affine_grid(theta, (1, 1, H, W))
    return R.grid_sampler_2d(img[None, None], grid, 0, 1, False)[0, 0]


def _blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur (edge-replicated borders)."""
    if sigma <= 0:
        return img
    r = int(math.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    H, W = img.shape
    p = np.pad(img, ((r, r), (0, 0)), mode="edge")
    img = sum(k[i] * p[i:i + H] for i in range(2 * r + 1))
    p = np.pad(img, ((0, 0), (r, r)), mode="edge")
    return sum(k[i] * p[:, i:i + W] for i in range(2 * r + 1))


def _downscale(img: np.ndarray, f: int) -> np.ndarray:
    """Block mean by `f` (the size is cropped to a multiple of f)."""
    if f == 1:
        return img
    H, W = (img.shape[0] // f) * f, (img.shape[1] // f) * f
    return img[:H, :W].reshape(H // f, f, W // f, f).mean(axis=(1, 3))


# ----------------------------------------------------------------------------- a. registration
def _loss_and_grad(theta, photo, target, device):
    """MSE(grid_sample(photo, affine_grid(theta)), target) and its gradient w.r.t. theta (through our kernel)."""
    H, W = photo.shape
    base = affine_base(H, W)
    grid = np.einsum("hwk,rk->hwr", base, theta)[None]
    sampled = R.grid_sampler_2d(photo[None, None], grid, 0, 1, False)[0, 0]
    resid = sampled - target
    loss = float(np.mean(resid * resid))
    grad_out = (2.0 / resid.size) * resid
    from ..core.api import grid_sampler_2d_backward
    _, dgrid = grid_sampler_2d_backward(grad_out[None, None].astype(np.float32), photo[None, None].astype(np.float32),
                                        grid.astype(np.float32), interpolation_mode=0, padding_mode=1,
                                        align_corners=False, output_mask=(False, True), device=device)
    grad = np.einsum("hwr,hwk->rk", dgrid[0].astype(np.float64), base)
    return loss, grad


def register_affine(photo, target, levels=((4, 2.0), (2, 1.0), (1, 0.0)), steps: int = 150,
                    lr=(0.02, 0.005, 0.002), decay: float = 0.97, theta0=None, device: str = "local-task",
                    log=print) -> dict:
    """Recovers theta with target ~= grid_sample(photo, affine_grid(theta)), coarse to fine, by Adam.

    levels: (downscale factor, blur sigma in pixels of the full image) per
    level, coarse first; steps: Adam steps per level; lr: the learning rate
    of each level (or one for all), times decay**step within a level (Adam
    restarts at each level and its first steps have about the size of lr, so
    finer levels, which start close to the answer, get smaller rates).
    Returns {"theta", "loss" (per step), "final_loss", "levels" (step index
    where each level starts), "evaluations", "seconds"}.
    """
    t0 = time.perf_counter()
    theta = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]) if theta0 is None else np.array(theta0, dtype=np.float64)
    photo = np.asarray(photo, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    losses, starts, evals = [], [], 0
    rates = [lr] * len(levels) if np.isscalar(lr) else list(lr)
    if len(rates) != len(levels):
        raise ValueError(f"{len(rates)} learning rates for {len(levels)} levels")
    for li, (f, sigma) in enumerate(levels):
        P = _downscale(_blur(photo, sigma), f)
        T = _downscale(_blur(target, sigma), f)
        m, v = np.zeros_like(theta), np.zeros_like(theta)
        starts.append(len(losses))
        first = None
        for k in range(steps):
            loss, g = _loss_and_grad(theta, P, T, device)
            evals += 1
            losses.append(loss)
            first = loss if first is None else first
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            mh, vh = m / (1 - 0.9 ** (k + 1)), v / (1 - 0.999 ** (k + 1))
            theta = theta - rates[li] * decay ** k * mh / (np.sqrt(vh) + 1e-12)
        _log(log, f"  level {li + 1}/{len(levels)}: {P.shape[0]}x{P.shape[1]} px, blur sigma {sigma:g} px, "
                  f"{steps} Adam steps, loss {first:.3e} -> {losses[-1]:.3e}")
    final, _ = _loss_and_grad(theta, photo, target, device)
    return {"theta": theta, "loss": losses, "final_loss": final, "levels": starts, "evaluations": evals + 1,
            "seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- b. learned low-res image
def axis_matrix(n_in: int, n_out: int, align_corners: bool = False) -> np.ndarray:
    """(n_out, n_in) 1-D bilinear interpolation matrix, built by applying the reference forward to unit vectors."""
    unit = np.eye(n_in)[:, None, :, None]                       # n_in images of shape (1, n_in, 1)
    out = R.upsample_bilinear2d(unit, (n_out, 1), align_corners)  # (n_in, 1, n_out, 1)
    return out[:, 0, :, 0].T


def _upsample(x, out_hw):
    return R.upsample_bilinear2d(x[None, None], out_hw, False)[0, 0]


def _upsample_grad(r, in_hw, device):
    """A^T r for the bilinear upsampling A: (in_hw) -> r.shape, from OUR kernel (float32)."""
    from ..core.api import upsample_bilinear2d_backward
    H, W = r.shape
    g = upsample_bilinear2d_backward(r[None, None].astype(np.float32), (H, W), (1, 1, *in_hw), align_corners=False,
                                     device=device)
    return g[0, 0].astype(np.float64)


def _lowres_descent(y, in_hw, iters, device, x0=None, rel_tol=1e-10, log=None, fstar=None):
    """Gradient descent on mean((A x - y)^2) with step 1/L; returns (x, losses, lipschitz info)."""
    H, W = y.shape
    h, w = in_hw
    Ah, Aw = axis_matrix(h, H), axis_matrix(w, W)
    M = y.size
    # Gradient of mean((Ax-y)^2) is (2/M) A^T (Ax - y): Lipschitz L = (2/M) sigma_max(A)^2,
    # sigma_max(A) = sigma_max(Ah) sigma_max(Aw) since A = Ah (x) Aw.
    smax = np.linalg.norm(Ah, 2) * np.linalg.norm(Aw, 2)
    L = 2.0 / M * smax ** 2
    holder = 2.0 / M * (np.abs(Ah).sum(0).max() * np.abs(Aw).sum(0).max()) * (
        np.abs(Ah).sum(1).max() * np.abs(Aw).sum(1).max())
    # Power iteration on A^T A through the reference forward and our backward (a check of L).
    rng = np.random.default_rng(0)
    z = rng.standard_normal((h, w))
    lam = 0.0
    for _ in range(30):
        z /= np.linalg.norm(z)
        az = _upsample_grad(_upsample(z, (H, W)), (h, w), device)
        lam = float(np.vdot(z, az))
        z = az
    power = 2.0 / M * lam
    x = np.zeros((h, w)) if x0 is None else np.array(x0, dtype=np.float64)
    losses = []
    for k in range(iters):
        r = _upsample(x, (H, W)) - y
        losses.append(float(np.mean(r * r)))
        stop = k > 0 and losses[-2] - losses[-1] <= rel_tol * losses[-1]
        if log:
            gap = f"  (loss - optimum) / optimum {(losses[-1] - fstar) / fstar:.3e}" if fstar else ""
            _log(log, f"    iter {k:4d}  loss {losses[-1]:.12f}{gap}" + (
                f"  stop: relative decrease below {rel_tol:g}" if stop else ""))
        if stop:
            break
        x = x - (1.0 / L) * (2.0 / M) * _upsample_grad(r, (h, w), device)
    return x, losses, {"L": L, "power_iteration": power, "holder_bound": holder}


def _monotone(losses) -> bool:
    return all(b <= a for a, b in zip(losses, losses[1:]))


def learn_lowres(photo, factor: int = 4, iters: int = 300, device: str = "local-task", log=print) -> dict:
    """The (H/factor, W/factor) image whose bilinear upsampling best matches `photo`, by gradient descent.

    Returns {"x", "loss" (per iteration), "optimum" (closed-form least-squares
    solution), "optimum_loss", "relative_gap", "monotone", "L", ...}.
    """
    t0 = time.perf_counter()
    y = np.asarray(photo, dtype=np.float64)
    H, W = y.shape
    h, w = H // factor, W // factor
    # Closed form: A = Ah (x) Aw, so x* = pinv(Ah) y pinv(Aw)^T (both have full column rank).
    Ah, Aw = axis_matrix(h, H), axis_matrix(w, W)
    xs = np.linalg.lstsq(Ah, np.linalg.lstsq(Aw, y.T, rcond=None)[0].T, rcond=None)[0]
    fstar = float(np.mean((_upsample(xs, (H, W)) - y) ** 2))
    x, losses, lip = _lowres_descent(y, (h, w), iters, device, log=log, fstar=fstar)
    naive = _downscale(y, factor)
    naive_loss = float(np.mean((_upsample(naive, (H, W)) - y) ** 2))
    return {"x": x, "loss": losses, "iterations": len(losses) - 1, "optimum": xs, "optimum_loss": fstar,
            "relative_gap": (losses[-1] - fstar) / fstar, "max_abs_diff_to_optimum": float(np.abs(x - xs).max()),
            "monotone": _monotone(losses), "naive": naive, "naive_loss": naive_loss,
            "seconds": time.perf_counter() - t0, **lip}


def lowres_crop_check(photo, crop: int = 32, factor: int = 4, iters: int = 300, device: str = "local-task",
                      log=print) -> dict:
    """The same problem on a crop x crop patch, against np.linalg.lstsq with the explicit interpolation matrix.

    The matrix (crop^2 x (crop/factor)^2) is built column by column by applying
    the reference forward to unit images, independently of the separable form.
    """
    y = np.asarray(photo, dtype=np.float64)
    H, W = y.shape
    i0, j0 = (H - crop) // 2, (W - crop) // 2
    yc = y[i0:i0 + crop, j0:j0 + crop]
    n = crop // factor
    units = np.eye(n * n).reshape(n * n, 1, n, n)
    A = R.upsample_bilinear2d(units, (crop, crop), False).reshape(n * n, crop * crop).T
    xs = np.linalg.lstsq(A, yc.ravel(), rcond=None)[0].reshape(n, n)
    fstar = float(np.mean((A @ xs.ravel() - yc.ravel()) ** 2))
    x, losses, lip = _lowres_descent(yc, (n, n), iters, device)
    gap = (losses[-1] - fstar) / fstar
    _log(log, f"  crop {crop}x{crop} at ({i0}, {j0}) -> {n}x{n}: gradient descent loss {losses[-1]:.10f} after "
              f"{len(losses) - 1} iterations, np.linalg.lstsq optimum {fstar:.10f}, relative gap {gap:.2e}, "
              f"max |x - x*| {np.abs(x - xs).max():.2e}")
    return {"crop": (i0, j0, crop), "x": x, "lstsq": xs, "loss": losses, "lstsq_loss": fstar, "relative_gap": gap,
            "max_abs_diff": float(np.abs(x - xs).max()), "monotone": _monotone(losses), **lip}


# ----------------------------------------------------------------------------- c. output files
def _save_gray(path, img, lo=0.0, hi=1.0, scale: int = 1, title: str = ""):
    """A grayscale PNG of `img` (black = lo, white = hi) under a title band that names it and its scale."""
    from PIL import Image, ImageDraw
    a = np.clip((np.asarray(img, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    im = Image.fromarray((a * 255 + 0.5).astype(np.uint8), mode="L")
    if scale > 1:
        im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
    lines = [title or os.path.splitext(os.path.basename(path))[0], f"black {lo:g}, white {hi:g}"]
    band = 12 * len(lines) + 6
    out = Image.new("L", (max(im.width, 8 * max(len(t) for t in lines) // 1 + 8), im.height + band), 255)
    out.paste(im, (0, band))
    draw = ImageDraw.Draw(out)
    for k, t in enumerate(lines):
        draw.text((4, 3 + 12 * k), t, fill=0)
    out.save(path)
    return path


def _save_curves(path, reg, low, crop):
    try:
        from matplotlib.figure import Figure  # standalone: no pyplot state in the caller's process
    except ImportError:
        return None
    fig = Figure(figsize=(11, 4))
    ax = fig.subplots(1, 2)
    ax[0].semilogy(reg["loss"], lw=1)
    for s in reg["levels"][1:]:
        ax[0].axvline(s, color="gray", ls=":", lw=0.8)
    ax[0].set(title="a. registration (Adam, coarse to fine)", xlabel="step (dotted: next pyramid level)",
              ylabel="mean squared difference")
    gap = np.maximum(np.array(low["loss"]) - low["optimum_loss"], 1e-18)
    ax[1].semilogy(gap, label="whole image")
    cg = np.maximum(np.array(crop["loss"]) - crop["lstsq_loss"], 1e-18)
    ax[1].semilogy(cg, label="32x32 crop (vs np.linalg.lstsq)")
    ax[1].set(title="b. learned low-res image (gradient descent, step 1/L)", xlabel="iteration",
              ylabel="loss - least-squares optimum")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- the demo
def run_demo(out_dir="demo_output", quick: bool = False, device: str = "local-task", log=print) -> dict:
    """Runs tasks a, b and c on ``skimage.data.astronaut()`` (NASA, public domain); returns the results.

    quick: 128x128 photo and fewer steps (otherwise 256x256).  Raises
    AssertionError when the registration misses theta by REGISTRATION_BOUND or
    more, or the low-res loss does not fall monotonically to within
    LOWRES_GAP_BOUND of the least-squares optimum, NotADirectoryError when out_dir is a file.
    """
    t_start = time.perf_counter()
    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"{out_dir} is not a directory: the demo writes its files into one")
    os.makedirs(out_dir, exist_ok=True)
    size = 128 if quick else 256
    photo = load_photo(size)
    _log(log, f"photo: {PHOTO_CREDIT}; grayscale float32, {size}x{size}")
    files = [_save_gray(os.path.join(out_dir, "photo.png"), photo, title="the photo (skimage astronaut, gray)")]

    # a. registration
    theta_true = affine_theta(10.0, 1.05, (0.05, -0.04))
    target = _warp(photo.astype(np.float64), theta_true)
    _log(log, "\na. image registration: recover the affine warp of the photo with grid_sampler_2d_backward "
              "(bilinear, border, align_corners=False, output_mask=(False, True))")
    reg = register_affine(photo, target, steps=100 if quick else 150, device=device, log=log)
    theta = reg["theta"]
    err = float(np.abs(theta - theta_true).max())
    _log(log, "  parameter      recovered       truth")
    for r in range(2):
        for k in range(3):
            _log(log, f"  theta[{r},{k}]  {theta[r, k]:12.6f}  {theta_true[r, k]:12.6f}")
    d, dt = describe_theta(theta), describe_theta(theta_true)
    _log(log, f"  rotation {d['angle_deg']:.4f} deg (truth {dt['angle_deg']:.4f}), scale {d['scale']:.5f} "
              f"(truth {dt['scale']:.5f}), shift ({d['shift'][0]:.5f}, {d['shift'][1]:.5f}) "
              f"(truth ({dt['shift'][0]:.5f}, {dt['shift'][1]:.5f}))")
    _log(log, f"  max |theta - theta_true| = {err:.2e} (bound {REGISTRATION_BOUND:g}); final loss "
              f"{reg['final_loss']:.3e}; {reg['evaluations']} gradient evaluations in {reg['seconds']:.1f} s")
    registered = _warp(photo.astype(np.float64), theta)
    files += [_save_gray(os.path.join(out_dir, "registration_target.png"), target,
                         title="a. target: the photo under a known affine warp"),
              _save_gray(os.path.join(out_dir, "registration_recovered.png"), registered,
                         title=f"a. the photo under the recovered warp (|theta error| {err:.1e})"),
              _save_gray(os.path.join(out_dir, "registration_diff_before.png"), np.abs(photo - target), 0, 0.5,
                         title="a. |photo - target| before"),
              _save_gray(os.path.join(out_dir, "registration_diff_after.png"), np.abs(registered - target), 0, 0.5,
                         title="a. |recovered - target| after")]

    # b. learned low-resolution image
    factor = 4
    _log(log, f"\nb. learned low-resolution image: the {size // factor}x{size // factor} image whose bilinear "
              f"upsampling best matches the photo, gradient from upsample_bilinear2d_backward, step 1/L")
    low = learn_lowres(photo, factor=factor, iters=200 if quick else 300, device=device, log=log)
    _log(log, f"  L = {low['L']:.6e} (exact: sigma_max(Ah)^2 sigma_max(Aw)^2 * 2/M); power iteration through "
              f"our kernel {low['power_iteration']:.6e}; ||A||_1 ||A||_inf bound {low['holder_bound']:.6e}")
    _log(log, f"  loss fell monotonically: {low['monotone']} ({low['iterations']} iterations, {low['seconds']:.1f} s)")
    _log(log, f"  whole image: loss {low['loss'][-1]:.10f}, least-squares optimum {low['optimum_loss']:.10f}, "
              f"relative gap {low['relative_gap']:.2e}, max |x - x*| {low['max_abs_diff_to_optimum']:.2e}")
    _log(log, f"  (block-mean downscaling then upsampling: loss {low['naive_loss']:.6f}, "
              f"{low['naive_loss'] / low['loss'][-1]:.2f}x the learned image's)")
    crop = lowres_crop_check(photo, crop=32, factor=factor, iters=300, device=device, log=log)
    up = _upsample(low["x"], photo.shape)
    files += [_save_gray(os.path.join(out_dir, "lowres_learned.png"), low["x"], scale=factor,
                         title=f"b. learned {size // factor}x{size // factor} image (shown {factor}x)"),
              _save_gray(os.path.join(out_dir, "lowres_learned_upsampled.png"), up,
                         title="b. its bilinear upsampling"),
              _save_gray(os.path.join(out_dir, "lowres_naive_upsampled.png"), _upsample(low["naive"], photo.shape),
                         title="b. block means, upsampled (the naive image)"),
              _save_gray(os.path.join(out_dir, "lowres_error.png"), np.abs(up - photo), 0, 0.25,
                         title="b. |upsampled learned image - photo|")]

    # c. curves
    curves = _save_curves(os.path.join(out_dir, "loss_curves.png"), reg, low, crop)
    if curves:
        files.append(curves)
    else:
        _log(log, "\nmatplotlib is not importable: the loss-curve plot is skipped (pip install matplotlib)")

    _log(log, f"\nwrote {len(files)} PNG files to {out_dir}:")
    for f in files:
        _log(log, f"  {os.path.basename(f)}")
    results = {
        "photo": {"credit": PHOTO_CREDIT, "size": size},
        "registration": {"theta_true": theta_true, "theta": theta, "max_abs_error": err,
                         "bound": REGISTRATION_BOUND, "loss": reg["loss"], "final_loss": reg["final_loss"],
                         "evaluations": reg["evaluations"], "seconds": reg["seconds"]},
        "lowres": {k: low[k] for k in ("loss", "iterations", "optimum_loss", "relative_gap", "monotone", "L",
                                       "power_iteration", "holder_bound", "naive_loss", "max_abs_diff_to_optimum")},
        "crop": {k: crop[k] for k in ("crop", "loss", "lstsq_loss", "relative_gap", "max_abs_diff", "monotone")},
        "gap_bound": LOWRES_GAP_BOUND,
        "files": files,
        "seconds": time.perf_counter() - t_start,
    }
    _log(log, f"done in {results['seconds']:.1f} s")
    assert err < REGISTRATION_BOUND, f"registration error {err:.2e} >= {REGISTRATION_BOUND}"
    assert low["monotone"] and crop["monotone"], "the low-res loss did not fall monotonically"
    assert low["relative_gap"] < LOWRES_GAP_BOUND and crop["relative_gap"] < LOWRES_GAP_BOUND, \
        f"low-res gap {low['relative_gap']:.2e} / crop gap {crop['relative_gap']:.2e} >= {LOWRES_GAP_BOUND}"
    return results
