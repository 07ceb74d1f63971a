"""`aclnn-iree bench --op torch`: training steps through aclnn_iree.torch beside PyTorch's.

For each suite case (aclnn_iree.tools.bench.CASES, float32, same data and thread count) one
training step is the forward and the backward of grid_sample (w.r.t. input and grid) or of
interpolate(mode="bilinear") (w.r.t. input), timed four ways in alternating blocks:

* PyTorch eager (F.grid_sample / F.interpolate);
* PyTorch with torch.compile (inductor compiles forward and backward; compile time outside
  the timer);
* ours in eager mode (aclnn_iree.torch.grid_sample / interpolate: our forward and backward
  kernels);
* ours under torch.compile (our ops stay calls in the compiled forward and backward graphs).

It prints the step times and the ratios (a PyTorch row's time / ours, > 1 means our step
is faster), then the torch layer's host cost per call over IREE's own invoke and wait, and
a tiny training step beside PyTorch's (custom_op_overhead_us).  With `--device cuda`
(run_cuda_torch_bench) the steps run on CUDA tensors, ours both through IREE's runtime and
launched on PyTorch's stream.
"""
from __future__ import annotations

import os

import numpy as np

from .bench import BENCHES, CASES, QUICK, _first_line, alternating_medians

__all__ = ["run_torch_bench", "run_cuda_torch_bench", "custom_op_overhead_us", "iree_floor"]

LAUNCH_ENV = "ACLNN_IREE_CUDA_LAUNCH"  # aclnn_iree.torch._cuda's switch (not imported: it needs PyTorch)


def _step(case, torch, F, AT, ours: bool, compiled: bool, cuda: bool = False, launch: str | None = None):
    """(step function) for one case: forward + backward, gradients into fresh .grad fields.
    cuda: on CUDA tensors (the same values, each step synchronised: its time is its kernels');
    launch: the step sets ACLNN_IREE_CUDA_LAUNCH to it (our arms on CUDA: "iree", "stream")."""
    forward, args, go = BENCHES[case.op].torch_step(case, torch, AT if ours else F)
    if cuda:  # .to keeps each tensor's memory format (the NHWC cases' channels_last)
        args = [a.detach().to("cuda").requires_grad_(True) for a in args]
        go = go.to("cuda")
    if compiled:
        forward = torch.compile(forward, fullgraph=True)

    def step():
        if launch is not None:
            os.environ[LAUNCH_ENV] = launch
        for a in args:
            a.grad = None
        forward(*args).backward(go)
        if cuda:
            torch.cuda.synchronize()
        return [a.grad for a in args]
    return step


def _step_cases(quick: bool) -> list:
    """The suite's cases with a training step (a forward operator's runs in its backward's)."""
    return [c for c in CASES if (not quick or c.name in QUICK) and BENCHES[c.op].torch_step is not None]


def _checked_times(case, steps: dict, repeats: int, required) -> tuple:
    """(median seconds per arm, {arm: first line of its error}) of one case's step functions
    `steps` ({arm: step}): each runs twice untimed (compiles; a stream launch's first call of a
    signature leaves the plan the second launches) and must give the eager arm's gradients; an
    arm that raises is left out (inductor's codegen fails on some shapes), except those in
    `required`, whose error propagates."""
    ref = [t.detach().cpu().clone() for t in steps["eager"]()]
    failed = {}
    for name, fn in list(steps.items()):
        try:
            fn()
            got = fn()
        except Exception as e:
            if name in required:
                raise
            failed[name] = _first_line(e)
            del steps[name]
            continue
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a.detach().cpu().numpy(), b.numpy(), rtol=1e-3, atol=1e-3 * float(b.abs().max()),
                                       err_msg=f"{case.name}: {name} computes other gradients")
    return alternating_medians(steps, repeats), failed


def run_cuda_torch_bench(quick=False, repeats=10, out=print) -> dict:
    """`bench --op torch --device cuda`: the training steps on CUDA tensors, PyTorch eager and
    torch.compile beside ours launched by IREE's runtime (PyTorch's stream synchronised around
    each call) and by the stream launch (ACLNN_IREE_CUDA_LAUNCH=stream: on PyTorch's stream,
    aclnn_iree.torch._cuda), alternating; prints the table, returns the rows.  Raises
    RuntimeError where PyTorch sees no CUDA device."""
    import torch
    import torch.nn.functional as F
    import aclnn_iree.torch as AT
    if not torch.cuda.is_available():
        raise RuntimeError("bench --op torch --device cuda: this PyTorch sees no CUDA device")
    before = os.environ.get(LAUNCH_ENV)
    cases = _step_cases(quick)
    out(f"training steps (forward + backward) on {torch.cuda.get_device_name()}, float32; medians of {repeats}, "
        "each step synchronised; compile times outside the timer")
    out(f"{'case':40s} {'eager ms':>9s} {'compiled':>9s} {'ours iree':>10s} {'ours stream':>12s} "
        f"{'x eager':>8s} {'stream/iree':>11s}")
    rows = []
    try:
        for case in cases:
            torch._dynamo.reset()
            steps = {"eager": _step(case, torch, F, AT, False, False, cuda=True),
                     "compiled": _step(case, torch, F, AT, False, True, cuda=True),
                     "ours_iree": _step(case, torch, F, AT, True, False, cuda=True, launch="iree"),
                     "ours_stream": _step(case, torch, F, AT, True, False, cuda=True, launch="stream")}
            t, failed = _checked_times(case, steps, repeats, ("eager",))
            best = min(t.get("ours_iree", float("inf")), t.get("ours_stream", float("inf")))
            row = {"case": case.name, **{f"{k}_ms": 1e3 * v for k, v in t.items()},
                   "ratio_eager": t["eager"] / best if best < float("inf") else None,
                   "stream_over_iree": (t["ours_iree"] / t["ours_stream"] if "ours_iree" in t and "ours_stream" in t
                                        else None), "failed": failed}
            rows.append(row)
            cell = {k: f"{1e3 * t[k]:{w}.3f}" if k in t else f"{'failed':>{w}s}"
                    for k, w in (("compiled", 9), ("ours_iree", 10), ("ours_stream", 12))}
            ratio = "n/a" if row["ratio_eager"] is None else f"{row['ratio_eager']:.2f}"
            gain = "n/a" if row["stream_over_iree"] is None else f"{row['stream_over_iree']:.2f}"
            out(f"{case.name:40s} {row['eager_ms']:9.3f} {cell['compiled']} {cell['ours_iree']} {cell['ours_stream']} "
                f"{ratio:>8s} {gain:>11s}")
            for name, err in failed.items():
                out(f"  warning: {name.replace('_', ' ')} failed on this case and is left out of it: {err}")
    finally:
        if before is None:
            os.environ.pop(LAUNCH_ENV, None)
        else:
            os.environ[LAUNCH_ENV] = before
    return {"training_steps": rows, "device": "cuda"}


def iree_floor(grad_output, input, grid):
    """(call, (grad_input, grad_grid)): `call()` makes the grid-sampler backward (bilinear,
    zeros, align_corners False, both outputs) on these NumPy arrays on local-sync with IREE's
    runtime alone: the argument list of the kernel's buffer views (made once, by the aclnn
    layer's phase 1) and its workspace, the invoke, the wait on its fence.  The floor under
    any layer's call of that kernel; the two arrays are the aclTensors it writes (their
    .numpy() after a call)."""
    import iree.runtime as rt
    from ..core import aclnn as A
    tensors = [A.aclCreateTensor(a, device="local-sync") for a in (grad_output, input, grid)]
    outputs = [A.aclCreateTensor(shape=a.shape, dtype=a.dtype, device="local-sync") for a in (input, grid)]
    status, size, executor = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        *tensors, 0, 0, False, A.aclCreateBoolArray([True, True]), *outputs)
    if status:
        raise RuntimeError(f"phase 1 failed ({status}): {A.aclGetRecentErrMsg()}")
    kernel, dev, views = executor.kernel, executor.device, list(executor.views)
    ws = A.aclrtMalloc(size, "local-sync")[1].buffer if size else dev.placeholder
    sem = dev.hal.create_semaphore(0)
    value = [0]

    def call():
        v = value[0] = value[0] + 1
        args = rt.VmVariantList(len(views) + 3)
        for view in views:
            args.push_ref(view)
        args.push_ref(ws)
        signal = rt.HalFence.create_at(sem, v)
        fn, *rest = kernel.fenced_call(args, rt.HalFence.create_at(sem, v - 1), signal)
        fn(*rest)
        signal.wait()
    call.keep = (tensors, executor)  # the executor's tensors own the views' memory
    return call, outputs


def _tiny_step(torch, functional):
    """One training step on 1x1x4x4: interpolate x2 then grid_sample, forward and backward."""
    x = torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    grid = (torch.rand(1, 4, 4, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1).requires_grad_()

    def step():
        x.grad = grid.grad = None
        y = functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        functional.grid_sample(y, grid, align_corners=False).sum().backward()
    return step


def custom_op_overhead_us(torch, repeats: int = 200, blocks: int = 10) -> dict:
    """The torch layer's host cost per call, on the tiny 1x1x4x4 grid-sampler backward
    (microseconds, local-sync): IREE's own call of the same kernel ("iree_us": the argument
    list, invoke and fence wait, buffer views made; iree_floor), the call as autograd's
    first-order backward makes it, below the op's autograd wrapper ("below_autograd_us";
    _library.below_autograd), a direct call of the custom op, which passes that wrapper
    ("custom_op_us"), and the Pythonic call ("pythonic_us"); "host_us" and
    "custom_op_host_us" are the first two's cost over IREE's.  Then a tiny training step
    (_tiny_step: interpolate and grid_sample on 1x1x4x4, forward and backward) through
    aclnn_iree.torch and through PyTorch ("step_us", "torch_step_us"; `step_ratio` ours /
    PyTorch's).

    Local-sync: on local-task a tiny call's time is mostly the wake-up of a worker thread,
    whose jitter on a shared VM hides a difference of microseconds (the layers run such
    calls inline anyway: docs/performance.md#host-overhead).  `blocks` rounds of adjacent blocks of
    `repeats` calls of each arm: each time is the least of its block medians, each cost the
    median over rounds of the difference within a round, so that a drift of the machine's
    speed between rounds (tens of microseconds on a shared VM) falls on both sides."""
    import torch.nn.functional as F
    import aclnn_iree.torch as AT
    from ..core import api
    from ..torch import _bridge
    from ..torch import _library as L
    from ..torch import grid_sampler as GS
    x = torch.ones(1, 1, 4, 4)
    g = torch.zeros(1, 4, 4, 2)
    op = torch.ops.aclnn_iree.grid_sampler_2d_backward
    xn, gn = x.numpy(), g.numpy()
    floor, _ = iree_floor(xn, xn, gn)
    before = _bridge.get_cpu_device()
    _bridge.set_cpu_device("local-sync")

    set_grad = torch._C._set_grad_enabled

    def below_autograd():  # what the backward formula calls; grad mode is off in a backward
        set_grad(False)    # (torch.no_grad() would add its own ~1.5 us)
        try:
            return L.below_autograd(op, GS.grid_sampler_2d_backward, x, x, g, 0, 0, False, [True, True])
        finally:
            set_grad(True)

    try:
        calls = {"iree": floor, "below": below_autograd,
                 "op": lambda: op(x, x, g, 0, 0, False, [True, True]),
                 "pythonic": lambda: api.grid_sampler_2d_backward(xn, xn, gn, device="local-sync")}
        rounds = [alternating_medians(calls, repeats, blocks=1, warmup=20) for _ in range(blocks)]
        steps = {"ours": _tiny_step(torch, AT), "torch": _tiny_step(torch, F)}
        step_rounds = [alternating_medians(steps, max(1, repeats // 4), blocks=1, warmup=5)
                       for _ in range(blocks)]
    finally:
        _bridge.set_cpu_device(before)

    def over_iree(key):
        return 1e6 * float(np.median([r[key] - r["iree"] for r in rounds]))
    return {"iree_us": 1e6 * min(r["iree"] for r in rounds),
            "below_autograd_us": 1e6 * min(r["below"] for r in rounds),
            "custom_op_us": 1e6 * min(r["op"] for r in rounds),
            "pythonic_us": 1e6 * min(r["pythonic"] for r in rounds),
            "host_us": over_iree("below"), "custom_op_host_us": over_iree("op"),
            "step_us": 1e6 * min(r["ours"] for r in step_rounds),
            "torch_step_us": 1e6 * min(r["torch"] for r in step_rounds),
            "step_ratio": float(np.median([r["ours"] / r["torch"] for r in step_rounds]))}


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
    cases = _step_cases(quick)
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
        t, failed = _checked_times(case, steps, repeats, ("eager", "ours"))
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
    o = overhead
    out(f"host cost per call, 1x1x4x4 grid-sampler backward on local-sync: IREE's invoke and wait "
        f"{o['iree_us']:.1f} us; as autograd's backward calls our op {o['below_autograd_us']:.1f} us "
        f"({o['host_us']:.1f} us over IREE's), the custom op called directly {o['custom_op_us']:.1f} us "
        f"({o['custom_op_host_us']:.1f} us over), the Pythonic call {o['pythonic_us']:.1f} us")
    out(f"tiny training step (1x1x4x4 interpolate x2 + grid_sample, forward + backward): ours "
        f"{o['step_us']:.0f} us, PyTorch's {o['torch_step_us']:.0f} us ({o['step_ratio']:.2f}x PyTorch's time)")
    return {"training_steps": rows, "custom_op_overhead": overhead, "threads": threads}
