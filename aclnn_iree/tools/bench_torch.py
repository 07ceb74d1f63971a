"""`aclnn-iree bench --op torch`: training steps through aclnn_iree.torch beside PyTorch's.

For each suite case (aclnn_iree.tools.bench.CASES, float32, same data and thread count) one
training step is the forward and the backward of grid_sample (w.r.t. input and grid) or of
interpolate(mode="bilinear") (w.r.t. input), timed four ways in alternating blocks:

* PyTorch eager (F.grid_sample / F.interpolate);
* PyTorch with torch.compile (inductor compiles forward and backward; compile time outside
  the timer);
* ours in eager mode (aclnn_iree.torch.grid_sample / interpolate: PyTorch's forward, our
  backward);
* ours under torch.compile (our backward ops stay calls in the compiled backward graph).

It prints the step times and the ratios (a PyTorch row's time / ours, > 1 means our
backward makes the step faster), and the overhead of a custom-op call over the Pythonic
call on a tiny case (microseconds).
"""
from __future__ import annotations

import numpy as np

from .bench import BENCHES, CASES, QUICK, _first_line, alternating_medians

__all__ = ["run_torch_bench", "custom_op_overhead_us"]


def _step(case, torch, F, AT, ours: bool, compiled: bool):
    """(step function) for one case: forward + backward, gradients into fresh .grad fields."""
    forward, args, go = BENCHES[case.op].torch_step(case, torch, AT if ours else F)
    if compiled:
        forward = torch.compile(forward, fullgraph=True)

    def step():
        for a in args:
            a.grad = None
        forward(*args).backward(go)
        return [a.grad for a in args]
    return step


def custom_op_overhead_us(torch, repeats: int = 200, blocks: int = 10) -> dict:
    """Microseconds of the tiny 1x1x4x4 grid-sampler backward through the custom op and through
    the Pythonic call, and the host cost of the torch layer between them: for a direct call
    of the op ("custom_op_us", "overhead_us"), which passes the op's autograd wrapper (its
    double-backward formula), and as autograd's first-order backward calls it, below that
    wrapper ("below_autograd_us", "below_autograd_overhead_us"; _library.below_autograd).

    Both run on the synchronous CPU device (local-sync): on local-task a tiny call's time is
    mostly the wake-up of a worker thread, whose jitter on a shared VM hides a difference
    of microseconds.  `blocks` pairs of adjacent blocks of `repeats` calls (op, Pythonic,
    op, ...): each call's time is the least of its block medians, the overhead the median
    of the pairs' differences, so that a drift of the machine's speed between blocks (tens
    of microseconds on a shared VM) falls on both sides of each difference."""
    from ..core import api
    from ..torch import _bridge
    x = torch.ones(1, 1, 4, 4)
    g = torch.zeros(1, 4, 4, 2)
    op = torch.ops.aclnn_iree.grid_sampler_2d_backward
    xn, gn = x.numpy(), g.numpy()
    before = _bridge.get_cpu_device()
    _bridge.set_cpu_device("local-sync")

    def below_autograd():
        with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
            return op(x, x, g, 0, 0, False, [True, True])

    try:
        fns = {"op": lambda: op(x, x, g, 0, 0, False, [True, True]), "below": below_autograd,
               "pythonic": lambda: api.grid_sampler_2d_backward(xn, xn, gn, device="local-sync")}
        pairs = [alternating_medians(fns, repeats, blocks=1, warmup=20) for _ in range(blocks)]
    finally:
        _bridge.set_cpu_device(before)

    def median_over(key):
        return 1e6 * float(np.median([p[key] - p["pythonic"] for p in pairs]))
    return {"custom_op_us": 1e6 * min(p["op"] for p in pairs),
            "below_autograd_us": 1e6 * min(p["below"] for p in pairs),
            "pythonic_us": 1e6 * min(p["pythonic"] for p in pairs),
            "overhead_us": median_over("op"), "below_autograd_overhead_us": median_over("below")}


def run_torch_bench(quick=False, threads=2, repeats=10, out=print) -> dict:
    """Times the training steps; prints the table; returns the rows."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        from ..core.install import install_command
        raise ImportError(f"bench --op torch needs PyTorch: {install_command('torch')}") from None
    import aclnn_iree.torch as AT
    torch.set_num_threads(threads)
    # every operator's training step once: a forward operator's runs in its backward's
    cases = [c for c in CASES if (not quick or c.name in QUICK) and BENCHES[c.op].torch_step is not None]
    out(f"training steps (forward + backward), {threads} threads, float32; medians of {repeats}; compile "
        "times outside the timer")
    out(f"{'case':40s} {'eager ms':>9s} {'compiled':>9s} {'ours':>8s} {'ours+cmp':>9s} "
        f"{'x eager':>8s} {'x comp':>7s}")
    rows = []
    for case in cases:
        # Every case compiles its own two forwards from one code object: dynamo's recompile
        # limit (8 per code object) would end the suite with a hard failure (fullgraph=True).
        torch._dynamo.reset()
        steps = {name: _step(case, torch, F, AT, ours, compiled)
                 for name, ours, compiled in (("eager", False, False), ("compiled", False, True),
                                              ("ours", True, False), ("ours_compiled", True, True))}
        ref = [t.clone() for t in steps["eager"]()]
        failed = {}
        for name, fn in list(steps.items()):  # compiles, and checks every row computes the same gradients
            try:
                got = fn()
            except Exception as e:  # inductor's codegen fails on some shapes: leave that row out
                if name in ("eager", "ours"):
                    raise
                failed[name] = _first_line(e)
                del steps[name]
                continue
            for a, b in zip(got, ref):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3, atol=1e-3 * float(b.abs().max()),
                                           err_msg=f"{case.name}: {name} computes other gradients")
        t = alternating_medians(steps, repeats)
        best_ours = min(t["ours"], t.get("ours_compiled", float("inf")))
        row = {"case": case.name, **{f"{k}_ms": 1e3 * v for k, v in t.items()},
               "ratio_eager": t["eager"] / best_ours,
               "ratio_compiled": t["compiled"] / best_ours if "compiled" in t else None, "failed": failed}
        rows.append(row)
        cell = {k: f"{1e3 * t[k]:{w}.2f}" if k in t else f"{'failed':>{w}s}"
                for k, w in (("compiled", 9), ("ours_compiled", 9))}
        ratio = f"{row['ratio_compiled']:7.2f}" if row["ratio_compiled"] is not None else f"{'n/a':>7s}"
        out(f"{case.name:40s} {row['eager_ms']:9.2f} {cell['compiled']} {row['ours_ms']:8.2f} "
            f"{cell['ours_compiled']} {row['ratio_eager']:8.2f} {ratio}")
        for name, err in failed.items():
            out(f"  warning: {name.replace('_', ' + ')} failed on this case and is left out of it: {err}")
    overhead = custom_op_overhead_us(torch)
    out(f"custom-op call {overhead['custom_op_us']:.0f} us vs the Pythonic call {overhead['pythonic_us']:.0f} us "
        f"on 1x1x4x4 (local-sync): {overhead['overhead_us']:.0f} us of torch layer; as autograd's backward calls "
        f"it (below its autograd wrapper) {overhead['below_autograd_us']:.0f} us, "
        f"{overhead['below_autograd_overhead_us']:.0f} us of torch layer")
    return {"training_steps": rows, "custom_op_overhead": overhead, "threads": threads}
