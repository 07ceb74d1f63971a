"""Where our CUDA time goes against PyTorch's, call by call (scripts/gpu_check.sh runs it after
its checks, on a machine with an NVIDIA GPU).  The successor of ../shared/gpu_gap_probe.py for
this package's current names (aclnn_iree.tools.bench, the operators' registry names), with the
torch layer's two CUDA launches beside it:

    python scripts/gpu_gap_probe.py              # the bench's quick cases + two tiny ones
    python scripts/gpu_gap_probe.py --all        # every bench case
    python scripts/gpu_gap_probe.py --graphs     # IREE's CUDA HAL with --cuda_use_streams=false
    python scripts/gpu_gap_probe.py --rehearse   # the same steps on the CPU (local-task and CPU
                                                 # tensors, no CUPTI): tries the script offline

One JSON line per case, then a summary.  Per case (microseconds a call, medians):
  wall_ours      phase 2 + aclrtSynchronizeStream (the aclnn layer: bench's phase2 column)
  raw_iree       the kept executor's kernel invoked and waited on through IREE's runtime alone
  pipe_ours      32 phase-2 launches back to back and one synchronize, per call (the host's
                 submit cost where it is below the GPU time)
  torch_iree     the torch layer's op on CUDA tensors through IREE's runtime (PyTorch's stream
                 synchronised before and after)
  torch_stream   the same with ACLNN_IREE_CUDA_LAUNCH=stream (launched on PyTorch's stream; the
                 functions it does not take stay on IREE's runtime)
  wall_torch     PyTorch's own op (aten), synchronised
  gpu_*          GPU time per call from CUPTI (torch.profiler sees IREE's kernels too: the same
                 primary context), with the kernels, memsets and copies per call by name
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

REHEARSE = "--rehearse" in sys.argv
GRAPHS = "--graphs" in sys.argv


def med_us(fn, n, warm=3):
    """Median microseconds of `n` calls of `fn` after `warm` untimed ones (the bench's timer)."""
    from aclnn_iree.tools.bench import _median_time
    return 1e6 * _median_time(fn, n, warm)


def gpu_profile(torch, fn, calls=5):
    """(GPU us per call, GPU operations per call, {kind:name: us per call}) from CUPTI; on the
    CPU (rehearsal) the CPU ops' self time instead."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync(torch)
    acts = [ProfilerActivity.CPU] + ([] if REHEARSE else [ProfilerActivity.CUDA])
    with profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        sync(torch)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    kinds = ("cpu_op",) if REHEARSE else ("kernel", "gpu_memcpy", "gpu_memset")
    per, n = {}, 0
    for e in events:
        if e.get("cat") in kinds and "dur" in e:
            k = f'{e["cat"]}:{e.get("name", "")[:60]}'
            per[k] = per.get(k, 0.0) + e["dur"] / calls
            n += 1
    return sum(per.values()), n / calls, {k: round(v, 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


def sync(torch):
    if not REHEARSE:
        torch.cuda.synchronize()


def torch_layer(case, arrays, torch, device):
    """The torch layer's backward op of the case on `device` tensors: a function of no
    arguments (the op and a synchronize)."""
    import aclnn_iree.torch  # noqa: F401  (registers torch.ops.aclnn_iree)
    ops = torch.ops.aclnn_iree
    t = [torch.from_numpy(a).to(device) for a in arrays]
    if case.op == "grid_sampler_2d_backward":
        def call():
            ops.grid_sampler_2d_backward(*t, case.mode, case.padding, case.align_corners, [True, True])
            sync(torch)
    elif case.op == "upsample_bilinear2d_backward":
        N, C, H, W, Ho, Wo = case.shape
        go = t[0].permute(0, 3, 1, 2) if case.layout == "NHWC" else t[0]  # NCHW sizes, channels_last memory

        def call():
            ops.upsample_bilinear2d_backward(go, [Ho, Wo], [N, C, H, W], case.align_corners, None, None)
            sync(torch)
    else:
        return None
    return call


def main():
    import iree.runtime as rt
    if GRAPHS:
        rt.flags.parse_flags("--cuda_use_streams=false")  # read when the cuda driver is made
    import torch
    from aclnn_iree import aclnn as A
    from aclnn_iree.tools import bench
    from aclnn_iree.tools.cases import Case
    device, tdev = ("local-task", "cpu") if REHEARSE else ("cuda", "cuda")
    name = "CPU (rehearsal)" if REHEARSE else torch.cuda.get_device_name(0)
    print(json.dumps({"device": name, "torch": torch.__version__, "mode": "graphs" if GRAPHS else "streams"}))
    st, stream = A.aclrtCreateStream(device)
    assert st == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    dev = stream.device
    cases = list(bench.CASES) + [Case("tiny_grid_1x1x4", "grid_sampler_2d_backward", (1, 1, 4, 4, 4, 4)),
                                 Case("tiny_up_1x1x4to8", "upsample_bilinear2d_backward", (1, 1, 4, 4, 8, 8))]
    if "--all" not in sys.argv:
        cases = [c for c in cases if c.name in bench.QUICK or c.name.startswith("tiny")]
    cases = [c for c in cases if c.op in ("grid_sampler_2d_backward", "upsample_bilinear2d_backward")]
    rows = []
    for case in cases:
        arrays = bench._inputs(case, np.random.default_rng(0))
        st, ws, ex, launch, outs = bench.BENCHES[case.op].phase2(case, arrays, stream)
        assert st == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
        A.aclSetAclOpExecutorRepeatable(ex)
        workspace = A.aclrtMalloc(ws, stream)[1] if ws > 0 else None

        def ours():
            assert launch(workspace, ws, ex, stream) == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
            A.aclrtSynchronizeStream(stream)

        def ours_pipe(k=32):
            for _ in range(k):
                launch(workspace, ws, ex, stream)
            A.aclrtSynchronizeStream(stream)

        sem = dev.hal.create_semaphore(0)
        state = {"v": 0}
        wsbuf = workspace.buffer if workspace is not None else dev.placeholder

        def raw():
            v = state["v"]
            signal = rt.HalFence.create_at(sem, v + 1)
            ex.kernel.launch(ex.views, wsbuf, rt.HalFence.create_at(sem, v), signal)
            signal.wait()
            state["v"] = v + 1

        torch_fn = bench._torch_fn(case, arrays, torch, cuda=not REHEARSE)
        row = {"case": case.name, "wall_ours_us": round(med_us(ours, 40), 1), "raw_iree_us": round(med_us(raw, 40), 1),
               "pipe_ours_us": round(med_us(ours_pipe, 5, warm=1) / 32, 1), "wall_torch_us": round(med_us(torch_fn, 40), 1)}
        layer = torch_layer(case, arrays, torch, tdev)
        for launch_mode in ("iree", "stream"):
            os.environ["ACLNN_IREE_CUDA_LAUNCH"] = launch_mode
            row[f"torch_{launch_mode}_us"] = round(med_us(layer, 40), 1)
        os.environ.pop("ACLNN_IREE_CUDA_LAUNCH")
        for who, fn in (("ours", ours), ("torch", torch_fn)):
            g, n, per = gpu_profile(torch, fn)
            row.update({f"gpu_{who}_us": round(g, 1), f"gpu_ops_{who}": n, f"{who}_breakdown": per})
        os.environ["ACLNN_IREE_CUDA_LAUNCH"] = "stream"
        g, n, per = gpu_profile(torch, layer)
        os.environ.pop("ACLNN_IREE_CUDA_LAUNCH")
        row.update(gpu_stream_us=round(g, 1), gpu_ops_stream=n, stream_breakdown=per)
        row["host_overhead_ours_us"] = round(row["wall_ours_us"] - row["gpu_ours_us"], 1)
        row["host_overhead_torch_us"] = round(row["wall_torch_us"] - row["gpu_torch_us"], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)

    def gm(xs):
        return float(np.exp(np.mean(np.log(np.maximum(xs, 1e-3)))))
    big = [r for r in rows if not r["case"].startswith("tiny")]
    print(json.dumps({"summary": {
        "geomean_wall_ratio_torch_over_ours": gm([r["wall_torch_us"] / r["wall_ours_us"] for r in big]),
        "geomean_ratio_torch_over_torch_layer_stream": gm([r["wall_torch_us"] / r["torch_stream_us"] for r in big]),
        "geomean_gpu_ratio_torch_over_ours": gm([max(r["gpu_torch_us"], 1) / max(r["gpu_ours_us"], 1) for r in big]),
        "median_host_overhead_ours_us": statistics.median(r["host_overhead_ours_us"] for r in rows),
        "median_host_overhead_torch_us": statistics.median(r["host_overhead_torch_us"] for r in rows),
        "median_python_layer_us": statistics.median(r["wall_ours_us"] - r["raw_iree_us"] for r in rows)}}))
    if not GRAPHS and not REHEARSE and "--no-child" not in sys.argv:
        # A/B: the same cases with IREE's CUDA graphs instead of streams (a fresh process: the
        # flag is read when the driver is made)
        subprocess.run([sys.executable, __file__, "--graphs"], timeout=240)


if __name__ == "__main__":
    main()
