"""The main job: dense stereo on the Middlebury 2014 "Motorcycle" pair, by gradient descent
through autograd, with both operators, forward and backward, from our kernels (aclnn_iree.torch).

The data is scikit-image's ``skimage.data.stereo_motorcycle()``: the left and right views
(500 x 741, RGB) and the ground-truth disparity of the left view, in pixels, ``inf`` where
there is none (Scharstein et al., "High-resolution stereo datasets with subpixel-accurate
ground truth", GCPR 2014).  Nobody here made the ground truth.

The method (``estimate``), at half resolution (250 x 370, the "working" resolution):

* The disparity is a sum of bilinearly upsampled grids at 1/32, 1/16, 1/8, 1/4 and 1/2 of
  the working resolution (``interpolate``: the upsample backward), in working pixels.
* The right view's features are warped into the left view at x - d (``grid_sample``,
  bilinear, border padding: the grid sampler backward, of the grid only), and compared
  with the left view's by a robust data term, ((a - b)^2 + 0.01^2)^(1/4) per channel (a
  Charbonnier penalty of exponent 1/4), averaged over two groups: the intensity, its x and
  y gradients and the colour; a soft census transform (5 x 5).  An edge-aware first-order
  Charbonnier smoothness term (weights exp(-20 |grad I|)) regularises.  Pixels whose match falls
  outside the right image carry no data term.
* Coarse to fine over an image pyramid (1/16, 1/8, 1/4, 1/2, 1 of the working resolution),
  Adam at each level; the finer grids join as the level reaches their resolution.
* The start is data-driven: the constant disparity with the lowest photometric cost at the
  coarsest level (never the ground truth).
* Both views are estimated at once (a batch of two: the left view, and the right view
  mirrored, whose disparity is the right view's), and a left-right consistency check
  replaces the disparities of the left pixels it rejects (occlusions, the left border that
  the right camera does not see) by the smaller of the nearest accepted neighbours' in
  the row (the background).
* The estimate is brought to 500 x 741 and to full-resolution pixels (x 2) for evaluation.

``--kernels torch`` runs the same job with PyTorch's own kernels (F.grid_sample,
F.interpolate, forward and backward); ours and PyTorch's forwards agree bitwise in float32
(docs/semantics.md), so the two jobs differ by the rounding of the backward sums.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

__all__ = ["StereoConfig", "load_pair", "disparity_metrics", "nonoccluded_mask", "estimate_disparity",
           "estimate_side_by_side", "baselines", "lr_consistency_fill"]

# The bad-pixel threshold (full-resolution pixels), as Middlebury's "bad 4.0".
BAD_THRESHOLD = 4.0


@dataclasses.dataclass(frozen=True)
class StereoConfig:
    """Parameters of the estimate (defaults: the demo's; ``quick()``: the fast variant)."""

    working_scale: int = 2  # the working resolution is the input's / this
    levels: tuple = (16, 8, 4, 2, 1)  # pyramid levels, as fractions of the working resolution
    steps: tuple = (60, 60, 80, 100, 100)  # Adam steps per level
    lr: tuple = (0.5, 0.5, 0.3, 0.2, 0.15)  # Adam learning rate per level (working pixels)
    lr_end: float = 0.2  # each level's rate falls linearly to this share of it
    grids: tuple = (32, 16, 8, 4, 2)  # disparity grids, as fractions of the working resolution
    census_radius: int = 2
    color_weight: float = 1.0
    intensity_weight: float = 0.2  # intensity, gradients and colour, beside ...
    census_weight: float = 0.8  # ... the census
    smoothness: float = 0.04
    edge: float = 20.0
    edges_from_gray: bool = True  # smoothness weights from the intensity (else the colour)
    lr_threshold: float = 2.0  # left-right check, full-resolution pixels
    max_disparity: float = 64.0  # of the constant-start search, full-resolution pixels

    @staticmethod
    def quick() -> "StereoConfig":
        """Quarter resolution, fewer levels and steps: a few seconds."""
        return StereoConfig(working_scale=4, levels=(8, 4, 2, 1), steps=(80, 80, 80, 80), lr=(0.5, 0.3, 0.2, 0.15),
                            grids=(16, 8, 4, 2))


def load_pair():
    """(left, right, disparity): skimage.data.stereo_motorcycle(), uint8 (500, 741, 3) views and the
    left view's ground-truth disparity (500, 741) float32 in pixels, inf where unknown."""
    try:
        import skimage.data
    except ImportError:
        from ..core.install import install_command
        raise ImportError(f"the demo needs scikit-image for its data: {install_command('demo')}") from None
    left, right, disparity = skimage.data.stereo_motorcycle()
    return left, right, disparity.astype(np.float32)


def disparity_metrics(estimate, truth, mask=None) -> dict:
    """Mean end-point error (pixels) and the share of pixels off by more than 4 pixels (%),
    over the pixels with finite ground truth (and inside `mask` when given)."""
    estimate, truth = np.asarray(estimate, np.float64), np.asarray(truth, np.float64)
    if estimate.shape != truth.shape:
        raise ValueError(f"estimate {estimate.shape} and ground truth {truth.shape} differ in shape")
    valid = np.isfinite(truth) if mask is None else (np.isfinite(truth) & mask)
    if not valid.any():
        raise ValueError("no pixel with a finite ground truth to evaluate")
    err = np.abs(estimate[valid] - truth[valid])
    return {"epe": float(err.mean()), "bad4_percent": float(100.0 * (err > BAD_THRESHOLD).mean()),
            "pixels": int(valid.sum())}


def nonoccluded_mask(truth) -> np.ndarray:
    """Left pixels the right camera sees under the ground truth: their match x - d lies in the
    image and no pixel to their right lands on or left of it (a closer surface would hide
    them).  Middlebury publishes such masks; scikit-image bundles none, so this derives one."""
    truth = np.asarray(truth, np.float64)
    finite = np.isfinite(truth)
    H, W = truth.shape
    target = np.arange(W)[None, :] - np.where(finite, truth, 0.0)
    after = np.minimum.accumulate(np.where(finite, target, np.inf)[:, ::-1], axis=1)[:, ::-1]
    nearest_right = np.concatenate([after[:, 1:], np.full((H, 1), np.inf)], axis=1)
    return finite & (target >= 0) & (target < nearest_right - 0.5)


def baselines(truth) -> dict:
    """The zero disparity and the best constant disparity (the ground truth's median, the
    constant of least mean end-point error), scored like an estimate."""
    finite = np.isfinite(truth)
    best = float(np.median(truth[finite]))
    return {"zero": {"disparity": 0.0, **disparity_metrics(np.zeros_like(truth), truth)},
            "best_constant": {"disparity": best, **disparity_metrics(np.full_like(truth, best), truth)}}


def lr_consistency_fill(left_disp, right_disp, threshold: float):
    """(filled left disparity, rejected mask): a left pixel is kept when the right view's
    disparity at its match x - d agrees within `threshold` and the match lies in the image;
    a rejected pixel takes the smaller of the nearest kept disparities in its row (an
    occluded pixel belongs to the background)."""
    H, W = left_disp.shape
    x = np.arange(W)[None, :]
    match = x - left_disp
    idx = np.clip(np.rint(match).astype(np.int64), 0, W - 1)
    rejected = (np.abs(left_disp - np.take_along_axis(right_disp, idx, axis=1)) > threshold) | (match < 0)
    cols = np.broadcast_to(np.arange(W), (H, W))
    left_src = np.maximum.accumulate(np.where(rejected, -1, cols), axis=1)
    right_src = np.minimum.accumulate(np.where(rejected, W, cols)[:, ::-1], axis=1)[:, ::-1]
    rows = np.arange(H)[:, None]
    from_left = np.where(left_src >= 0, left_disp[rows, np.clip(left_src, 0, W - 1)], np.inf)
    from_right = np.where(right_src < W, left_disp[rows, np.clip(right_src, 0, W - 1)], np.inf)
    fill = np.minimum(from_left, from_right)
    out = np.where(rejected & np.isfinite(fill), fill, left_disp)
    return out.astype(np.float32), rejected


# ----------------------------------------------------------------------------- the estimate
class _Functions:
    """grid_sample and interpolate of one backend: ours (aclnn_iree.torch) or PyTorch's."""

    def __init__(self, backward: str):
        import torch.nn.functional as F
        if backward == "ours":
            import aclnn_iree.torch as AT
            self.grid_sample, self.interpolate = AT.grid_sample, AT.interpolate
        elif backward == "torch":
            self.grid_sample = F.grid_sample
            self.interpolate = lambda x, **kw: F.interpolate(x, mode="bilinear", **kw)
        else:
            raise ValueError(f"backward must be 'ours' or 'torch', got {backward!r}")


def _features(torch, F, img, cfg):
    """Intensity, its gradients, the soft census transform (without the centre) and the colour:
    (N, C, H, W) from (N, 4, H, W) = gray + RGB."""
    gray = img[:, :1]
    gx = F.pad(gray[..., :, 1:] - gray[..., :, :-1], (0, 1, 0, 0))
    gy = F.pad(gray[..., 1:, :] - gray[..., :-1, :], (0, 0, 0, 1))
    r = cfg.census_radius
    k = 2 * r + 1
    patches = F.unfold(F.pad(gray, (r,) * 4, mode="replicate"), k).view(img.shape[0], k * k, *img.shape[2:])
    centre = (k * k) // 2
    diff = torch.cat([patches[:, :centre], patches[:, centre + 1:]], 1) - gray
    census = diff / torch.sqrt(0.81 + diff * diff)
    return torch.cat([gray, 4 * gx, 4 * gy, cfg.color_weight * img[:, 1:], census], 1), 6


def _channel_weights(torch, cfg, n_int, channels):
    """The data term's weight per feature channel: the intensity group's mean and the
    census group's mean, weighted (a (channels,) float32 tensor)."""
    return torch.tensor([cfg.intensity_weight / n_int] * n_int
                        + [cfg.census_weight / (channels - n_int)] * (channels - n_int), dtype=torch.float32)


def _robust_data_term(torch):
    """The data term per pixel, sum_c w_c ((a_c - b_c)^2 + eps^2)^(1/4), as one autograd
    Function: (a, b (N, C, H, W), w (C,), eps) -> (N, 1, H, W), the gradient of `a` only.
    Autograd through the composed ops makes ~20 passes over the (N, C, H, W) features per
    step (slices of the channel groups, each square root's backward, the square's); this
    makes 9, and the step at the finest level ~2x faster (PyTorch's elementwise ops were
    most of the job).  d/da (x^2 + eps^2)^(1/4) = x y / (2 t), t = x^2 + eps^2, y = t^(1/4)."""

    class RobustDataTerm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, weights, eps):
            x = a - b
            t = torch.addcmul(torch.tensor(eps * eps, dtype=x.dtype), x, x)
            y = t.sqrt().sqrt_()  # two square roots cost far less than a pow
            n, c, h, w = x.shape
            weights = weights.to(x.dtype)
            ctx.save_for_backward(x, t, y, weights)
            return torch.matmul(weights.view(1, 1, c), y.view(n, c, h * w)).view(n, 1, h, w)

        @staticmethod
        def backward(ctx, grad):
            x, t, y, weights = ctx.saved_tensors
            ga = (x * grad).mul_(y).div_(t).mul_(0.5 * weights.view(1, -1, 1, 1))
            return ga, (-ga if ctx.needs_input_grad[1] else None), None, None

    return RobustDataTerm


class _Adam:
    """torch.optim.Adam with its defaults (betas 0.9 / 0.999, eps 1e-8, no weight decay), as
    PyTorch's functional form ``torch.optim.adam.adam`` over state held here, with the
    learning rate given per step.  The same arithmetic and bits as the Optimizer class, but
    the class's ``step`` imports torch._dynamo on first use (1.9 s on a 2-core machine: a
    fifth of the ``--quick`` demo), and the functional form does not."""

    def __init__(self, torch, params):
        from torch.optim.adam import adam
        self.torch, self.adam, self.params = torch, adam, list(params)
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.steps = [torch.tensor(0.0) for _ in self.params]  # Adam's CPU step counters

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self, lr: float):
        with self.torch.no_grad():
            self.adam(self.params, [p.grad for p in self.params], self.exp_avgs, self.exp_avg_sqs, [], self.steps,
                 foreach=False, amsgrad=False, beta1=0.9, beta2=0.999, lr=lr, weight_decay=0.0, eps=1e-8,
                 maximize=False)


def _linear_decay(lr: float, lr_end: float, i: int, n: int) -> float:
    """The learning rate of step i of n: from lr down to lr * lr_end, linearly."""
    return lr * (1.0 - (1.0 - lr_end) * i / max(1, n - 1))


def _charbonnier(torch, x, eps=0.01):
    return torch.sqrt(x * x + eps * eps)


def _warp(torch, fn, feat, disp):
    """feat sampled at (x - disp, y), pixel centres (align_corners=False), border padding."""
    n, _, h, w = feat.shape
    xs = torch.arange(w, dtype=feat.dtype).view(1, 1, w)
    ys = torch.arange(h, dtype=feat.dtype).view(1, h, 1)
    gx = (xs - disp[:, 0] + 0.5) * (2.0 / w) - 1.0
    gy = ((ys + 0.5) * (2.0 / h) - 1.0).expand_as(gx)
    return fn.grid_sample(feat, torch.stack([gx, gy], -1), mode="bilinear", padding_mode="border", align_corners=False)


def warm_up(backends=("ours",)) -> float:
    """Pays a process's one-time costs before the timed jobs, outside their timers, so that
    neither job pays them for the other: importing torch and, per backend ("ours",
    "torch"), a tiny forward and backward of both operators (our modules load on first
    use).  Returns the seconds it took."""
    t = time.perf_counter()
    import torch
    for backward in backends:
        fn = _Functions(backward)
        coarse = torch.zeros(2, 1, 2, 3, requires_grad=True)
        disp = fn.interpolate(coarse, size=(4, 5), align_corners=False)
        _warp(torch, fn, torch.rand(2, 3, 4, 5), disp).sum().backward()
    return time.perf_counter() - t


def estimate_disparity(left, right, cfg: StereoConfig = StereoConfig(), backward: str = "ours", progress=True):
    """Estimates the left view's disparity (see the module docstring).

    left, right: uint8 (H, W, 3) views.  backward: "ours" (our kernels through
    aclnn_iree.torch) or "torch" (PyTorch's).  Returns a dict: "disparity" (H, W) float32
    in full-resolution pixels, "raw" (before the left-right check), "rejected" (the mask it
    filled), "losses" (per step), "level_starts" (step index of each level), "seconds"
    (the whole estimate), "backward_ms" (mean milliseconds of loss.backward() per step, per
    level and overall), "init_disparity" (the constant start, full-resolution pixels).
    """
    return estimate_side_by_side(left, right, cfg, (backward,), progress)[backward]


def estimate_side_by_side(left, right, cfg: StereoConfig = StereoConfig(), backends=("ours", "torch"),
                          progress=True) -> dict:
    """The estimates of several backends (estimate_disparity's results, keyed by backend),
    run in lockstep: one Adam step of each job in turn, so that all of them see the same
    machine (a slow period or a busy neighbour slows every job alike; run one after the
    other on a 2-core VM, the same job's time moved by 25 %).  Each job's "seconds" counts
    only its own work; the results are those of each job run alone (the jobs share
    nothing).  backends: a backend name or a sequence of them (duplicates run once);
    raises ValueError for none or an unknown one."""
    backends = (backends,) if isinstance(backends, str) else tuple(dict.fromkeys(backends))
    if not backends:
        raise ValueError("estimate_side_by_side needs at least one backend ('ours', 'torch')")
    jobs = {b: _estimate_steps(left, right, cfg, b) for b in backends}
    seconds, results, bar = dict.fromkeys(backends, 0.0), {}, None
    label = "+".join(backends)
    while jobs:
        for b in list(jobs):
            t = time.perf_counter()
            try:
                event = next(jobs[b])
            except StopIteration as stop:
                results[b], event = stop.value, None
                del jobs[b]
            seconds[b] += time.perf_counter() - t
            if not progress or event is None or b != backends[0]:
                continue
            if event[0] == "level":  # the lead job's levels pace the bar
                if bar is not None:
                    bar.close()
                from tqdm import tqdm
                # disable=None: no bar where stderr is not a terminal (a log file, CI)
                bar = tqdm(total=event[2], desc=f"{label} level {event[1]}", unit="step", leave=True, disable=None)
            else:
                bar.update(1)
                bar.set_postfix(loss=f"{event[1]:.4f}", refresh=False)
    if bar is not None:
        bar.close()
    for b in backends:
        results[b]["seconds"] = seconds[b]
    return results


def _estimate_steps(left, right, cfg, backward):
    """The estimate as a generator: yields ("level", description, steps) as each pyramid
    level starts and ("step", loss) after each Adam step; returns estimate_disparity's
    dict, less "seconds"."""
    import torch
    import torch.nn.functional as F
    fn = _Functions(backward)
    data_term = _robust_data_term(torch)
    H0, W0 = left.shape[:2]

    def as_input(a):  # gray + RGB in [0, 1], (1, 4, H0, W0)
        rgb = torch.from_numpy(np.ascontiguousarray(a, np.float32) / 255.0).permute(2, 0, 1)[None]
        gray = (0.2125 * rgb[:, :1] + 0.7154 * rgb[:, 1:2] + 0.0721 * rgb[:, 2:])
        return torch.cat([gray, rgb], 1)

    L, R = as_input(left), as_input(right)
    # batch of two problems: the left view against the right, and the mirrored right view
    # against the mirrored left (whose disparity is the right view's)
    views = torch.cat([L, torch.flip(R, [-1])], 0)
    others = torch.cat([R, torch.flip(L, [-1])], 0)
    s0 = cfg.working_scale
    H, W = H0 // s0, W0 // s0

    def resized(img, h, w):
        return F.interpolate(img, size=(h, w), mode="bilinear", align_corners=False, antialias=True)

    grids = [torch.zeros(2, 1, max(2, H // g), max(2, W // g), requires_grad=True) for g in cfg.grids]
    # the data-driven start: the best constant disparity at the coarsest level, per view
    s = cfg.levels[0]
    h, w = max(2, H // s), max(2, W // s)
    fv, _ = _features(torch, F, resized(views, h, w), cfg)
    fo, _ = _features(torch, F, resized(others, h, w), cfg)
    with torch.no_grad():
        candidates = np.arange(0.0, cfg.max_disparity / s0, 1.0)
        costs = torch.stack([_charbonnier(torch, _warp(torch, F, fo, torch.full((2, 1, h, w), float(d) / s)) - fv)
                             .mean(dim=(1, 2, 3)) for d in candidates], 1)
        start = torch.from_numpy(candidates).float()[costs.argmin(1)]
        grids[0][:, 0] = start.view(2, 1, 1)
    losses, level_starts, backward_s = [], [], []
    for li, s in enumerate(cfg.levels):
        h, w = max(2, H // s), max(2, W // s)
        vi = resized(views, h, w)
        fv, n_int = _features(torch, F, vi, cfg)
        weights = _channel_weights(torch, cfg, n_int, fv.shape[1])
        fo, _ = _features(torch, F, resized(others, h, w), cfg)
        rgb = vi[:, :1] if cfg.edges_from_gray else vi[:, 1:]
        ex = torch.exp(-cfg.edge * (rgb[..., :, 1:] - rgb[..., :, :-1]).abs().mean(1, keepdim=True))
        ey = torch.exp(-cfg.edge * (rgb[..., 1:, :] - rgb[..., :-1, :]).abs().mean(1, keepdim=True))
        xs = torch.arange(w, dtype=torch.float32).view(1, 1, 1, w)
        active = [g for g, f in zip(grids, cfg.grids) if f >= s]
        opt = _Adam(torch, active)
        n = cfg.steps[li]
        level_starts.append(len(losses))
        level_backward = []
        yield "level", f"1/{s * s0:<2d} {w}x{h}", n
        for i in range(n):
            opt.zero_grad()
            disp = sum(fn.interpolate(g, size=(h, w), align_corners=False) for g in active) / s
            visible = (xs - disp > 0).float()
            data = (data_term.apply(_warp(torch, fn, fo, disp), fv, weights, 0.01) * visible).mean()
            dx, dy = disp[..., :, 1:] - disp[..., :, :-1], disp[..., 1:, :] - disp[..., :-1, :]
            smooth = (_charbonnier(torch, dx) * ex).mean() + (_charbonnier(torch, dy) * ey).mean()
            loss = data + cfg.smoothness * smooth
            t = time.perf_counter()
            loss.backward()
            level_backward.append(time.perf_counter() - t)
            opt.step(_linear_decay(cfg.lr[li], cfg.lr_end, i, n))
            losses.append(loss.item())
            yield "step", losses[-1]
        backward_s.append(level_backward)
    with torch.no_grad():
        disp = sum(F.interpolate(g, size=(H, W), mode="bilinear", align_corners=False) for g in grids)
        full = F.interpolate(disp, size=(H0, W0), mode="bilinear", align_corners=False)[:, 0].numpy() * s0
    raw, right_disp = full[0], full[1][:, ::-1]
    filled, rejected = lr_consistency_fill(raw, right_disp, cfg.lr_threshold)
    all_bw = [t for lv in backward_s for t in lv]
    return {"disparity": filled, "raw": raw.astype(np.float32), "rejected": rejected, "losses": losses,
            "level_starts": level_starts,
            "backward_ms": {"per_level": [1e3 * float(np.mean(lv)) for lv in backward_s],
                            "mean": 1e3 * float(np.mean(all_bw))},
            "init_disparity": [float(v) * s0 for v in start]}
