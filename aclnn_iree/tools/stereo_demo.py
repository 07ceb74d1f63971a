"""`aclnn-iree demo`: the stereo job (aclnn_iree.tools.stereo) with its figure, files and summary.

Writes into `out_dir`:

* ``stereo.png``: one figure: the left view, the ground truth, our estimate (same colour
  scale, disparity in full-resolution pixels), the error map (|estimate - truth|, clipped
  at ERROR_CLIP pixels), and the loss per step with the pyramid levels marked; the
  metrics in the titles;
* ``disparity_full.npy``: the estimate at 500 x 741, float32, full-resolution pixels
  (what the figure and the metrics are computed from);
* ``results.json``: the metrics (all pixels with ground truth, and the non-occluded ones),
  the two baselines, the timings of each backward that ran (the whole job and the mean
  backward per step, per level), the iterations and the parameters.

The console shows a progress bar per level and a summary table.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

from . import stereo as S

__all__ = ["run_stereo_demo", "check_output_files", "OUTPUT_FILES", "ERROR_CLIP", "summary_table",
           "limit_openmp_spin", "OPENMP_SPINCOUNT"]

OUTPUT_FILES = ("stereo.png", "disparity_full.npy", "results.json")
ERROR_CLIP = 10.0  # pixels: the error map's colour scale ends here

# PyTorch's OpenMP workers (libgomp) spin about 11 ms after each parallel region before they
# sleep (measured here: GOMP_SPINCOUNT's default of 300000); a backward pass interleaves
# PyTorch's ops with our kernels, so on few cores IREE's task workers run beside a spinning
# thread at about half speed.  libgomp throttles its spinning itself when it knows the cores
# are oversubscribed; it cannot know about IREE's threads, so the demo says so.  20000 spins
# (well under a millisecond) keep PyTorch's back-to-back ops on hot threads (docs/pytorch.md).
OPENMP_SPINCOUNT = "20000"


def limit_openmp_spin(environ=os.environ, loaded=None) -> dict:
    """Sets GOMP_SPINCOUNT=OPENMP_SPINCOUNT in `environ` unless the user chose OpenMP's waiting
    (GOMP_SPINCOUNT or OMP_WAIT_POLICY set) or PyTorch is already loaded (libgomp reads it
    once, when it loads).  Returns what results.json records: the two variables as the job
    runs and whether the demo set one."""
    loaded = "torch" in sys.modules if loaded is None else loaded
    chosen = any(environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"))
    set_here = not chosen and not loaded
    if set_here:
        environ["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    return {"GOMP_SPINCOUNT": environ.get("GOMP_SPINCOUNT"), "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY"),
            "set_by_demo": set_here}


def check_output_files(out_dir):
    """Raises IsADirectoryError where one of OUTPUT_FILES in `out_dir` is a directory: found
    before the job (and, at the CLI, before PyTorch is imported), not when writing it."""
    for name in OUTPUT_FILES:
        if os.path.isdir(os.path.join(out_dir, name)):
            raise IsADirectoryError(f"{os.path.join(out_dir, name)} is a directory: the demo writes a file there")


def _metrics(estimate, truth, nonocc) -> dict:
    return {"all": S.disparity_metrics(estimate, truth), "nonoccluded": S.disparity_metrics(estimate, truth, nonocc)}


def summary_table(results: dict) -> str:
    """The console summary: each estimate and baseline, all pixels and non-occluded ones."""
    rows = [("method", "EPE px", "bad>4 %", "EPE noc", "bad>4 noc", "job s", "backward ms/step")]
    for name, run in results["runs"].items():
        m = run["metrics"]
        rows.append(("ours (our kernels)" if name == "ours" else "PyTorch's kernels", f"{m['all']['epe']:.3f}",
                     f"{m['all']['bad4_percent']:.2f}", f"{m['nonoccluded']['epe']:.3f}",
                     f"{m['nonoccluded']['bad4_percent']:.2f}", f"{run['seconds']:.1f}",
                     f"{run['backward_ms']['mean']:.2f}"))
    for name, b in results["baselines"].items():
        rows.append((f"baseline: {name.replace('_', ' ')} ({b['disparity']:.1f} px)", f"{b['all']['epe']:.3f}",
                     f"{b['all']['bad4_percent']:.2f}", f"{b['nonoccluded']['epe']:.3f}",
                     f"{b['nonoccluded']['bad4_percent']:.2f}", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if "speedup" in results:
        sp = results["speedup"]
        lines.append(f"our kernels vs PyTorch's: whole job {sp['job']:.2f}x, backward per step {sp['backward']:.2f}x "
                     "(> 1: ours faster)")
    return "\n".join(lines)


def _figure(path, left, truth, run, results):
    # A standalone Figure, not pyplot: no global backend switch or figure registry in a
    # caller's process (a notebook keeps its backend), and no pyplot import.
    from matplotlib.figure import Figure
    est = run["disparity"]
    m = results["runs"]["ours" if "ours" in results["runs"] else "torch"]["metrics"]["all"]
    finite = np.isfinite(truth)
    vmax = float(np.nanmax(np.where(finite, truth, np.nan)))
    fig = Figure(figsize=(17, 9.5), layout="constrained")
    ax = fig.subplots(2, 3)
    ax[0, 0].imshow(left)
    ax[0, 0].set_title("left view (Middlebury 2014 Motorcycle, 741 x 500)")
    im = ax[0, 1].imshow(np.where(finite, truth, np.nan), cmap="turbo", vmin=0, vmax=vmax)
    ax[0, 1].set_title("ground-truth disparity (white: none)")
    fig.colorbar(im, ax=ax[0, 1], label="disparity (px)", shrink=0.8)
    im = ax[0, 2].imshow(est, cmap="turbo", vmin=0, vmax=vmax)
    ax[0, 2].set_title(f"our estimate: EPE {m['epe']:.2f} px, {m['bad4_percent']:.1f} % off by > 4 px")
    fig.colorbar(im, ax=ax[0, 2], label="disparity (px)", shrink=0.8)
    err = np.where(finite, np.abs(est - truth), np.nan)
    im = ax[1, 0].imshow(np.minimum(err, ERROR_CLIP), cmap="magma", vmin=0, vmax=ERROR_CLIP)
    ax[1, 0].set_title(f"|estimate - truth|, clipped at {ERROR_CLIP:g} px")
    fig.colorbar(im, ax=ax[1, 0], label="end-point error (px)", shrink=0.8)
    ax[1, 1].imshow(run["rejected"], cmap="gray_r", vmin=0, vmax=1)
    ax[1, 1].set_title(f"black: pixels the left-right check filled ({100 * run['rejected'].mean():.1f} %)")
    for name, r in results["runs"].items():
        ax[1, 2].semilogy(r["losses"], label=f"{name} backward", lw=1)
    for i, start in enumerate(run["level_starts"]):
        ax[1, 2].axvline(start, color="gray", lw=0.6, ls=":")
        ax[1, 2].text(start, ax[1, 2].get_ylim()[1], f" 1/{run['level_fractions'][i]}", va="top", fontsize=8)
    ax[1, 2].set_xlabel("Adam step (levels: pyramid resolution vs the input)")
    ax[1, 2].set_ylabel("loss (data + smoothness)")
    ax[1, 2].set_title("loss per step, coarse to fine")
    ax[1, 2].legend()
    for a in ax.flat[:5]:
        a.set_xticks([])
        a.set_yticks([])
    fig.suptitle("Dense stereo by gradient descent: grid_sample and interpolate backward from aclnn-iree kernels")
    fig.savefig(path, dpi=80)


def run_stereo_demo(out_dir="demo_output", quick: bool = False, backward: str = "ours", device: str = "local-task",
                    progress: bool = True, log=print, openmp=None) -> dict:
    """Runs the stereo job and writes its files (see the module docstring); returns the results.

    backward: "ours", "torch" or "both" (both jobs, timed side by side).  device: the IREE
    device of our kernels for CPU tensors.  quick: StereoConfig.quick() (a few seconds).
    openmp: what limit_openmp_spin returned, if the caller ran it (before importing torch).
    Raises ImportError naming the extra when PyTorch or scikit-image is missing, OSError
    when out_dir cannot be written.
    """
    try:
        import torch
    except ImportError:
        from ..core.install import install_command
        raise ImportError(f"the demo needs PyTorch and scikit-image: {install_command('demo')} (docs/getting-started.md"
                          "#install; `aclnn-iree demo --photo` needs no PyTorch)") from None
    import aclnn_iree.torch as AT
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"{out_dir} is not a directory: the demo writes its files into one")
    os.makedirs(out_dir, exist_ok=True)
    if not os.access(out_dir, os.W_OK):
        raise PermissionError(f"cannot write into {out_dir}")
    check_output_files(out_dir)
    AT.set_cpu_device(device)
    left, right, truth = S.load_pair()
    nonocc = S.nonoccluded_mask(truth)
    cfg = S.StereoConfig.quick() if quick else S.StereoConfig()
    names = ["ours", "torch"] if backward == "both" else [backward]
    results = {"data": "skimage.data.stereo_motorcycle() (Middlebury 2014 Motorcycle, 500 x 741)",
               "config": dataclasses.asdict(cfg), "device": device, "threads": torch.get_num_threads(),
               "pixels_with_ground_truth": int(np.isfinite(truth).sum()),
               "nonoccluded_pixels": int(nonocc.sum()), "runs": {},
               "openmp": openmp or {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}}
    results["warm_up_seconds"] = S.warm_up(names)
    log(f"warm-up outside the timers (imports, module loading, first calls): {results['warm_up_seconds']:.1f} s")
    whose = " and ".join("our" if name == "ours" else "PyTorch's" for name in names)
    log(f"estimating with {whose} kernels, forward and backward ({sum(cfg.steps)} Adam steps over "
        f"{len(cfg.levels)} pyramid levels, two views at once"
        + (", the two jobs a step each in turn)" if len(names) > 1 else ")"))
    runs = S.estimate_side_by_side(left, right, cfg, names, progress=progress)
    for name, run in runs.items():
        run["level_fractions"] = [f * cfg.working_scale for f in cfg.levels]
        results["runs"][name] = {"metrics": _metrics(run["disparity"], truth, nonocc),
                                 "metrics_before_lr_check": _metrics(run["raw"], truth, nonocc),
                                 "seconds": run["seconds"], "backward_ms": run["backward_ms"],
                                 "iterations": int(sum(cfg.steps)), "init_disparity_px": run["init_disparity"],
                                 "filled_share": float(run["rejected"].mean()), "losses": run["losses"]}
    results["baselines"] = {k: {"disparity": v["disparity"], "all": {x: v[x] for x in ("epe", "bad4_percent")},
                                "nonoccluded": S.disparity_metrics(np.full_like(truth, v["disparity"]), truth, nonocc)}
                            for k, v in S.baselines(truth).items()}
    if len(runs) == 2:
        o, t = results["runs"]["ours"], results["runs"]["torch"]
        results["speedup"] = {"job": t["seconds"] / o["seconds"], "backward": t["backward_ms"]["mean"]
                              / o["backward_ms"]["mean"]}
        results["agreement"] = {"epe_difference": abs(o["metrics"]["all"]["epe"] - t["metrics"]["all"]["epe"]),
                                "max_disparity_difference": float(np.max(np.abs(runs["ours"]["disparity"]
                                                                               - runs["torch"]["disparity"])))}
    main = runs["ours" if "ours" in runs else "torch"]
    np.save(os.path.join(out_dir, "disparity_full.npy"), main["disparity"].astype(np.float32))
    _figure(os.path.join(out_dir, "stereo.png"), left, truth, main, results)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    log(summary_table(results))
    log(f"wrote {out_dir}/stereo.png, disparity_full.npy, results.json")
    return results
