"""`aclnn-iree bench`: our kernels beside PyTorch 2.13, in one run, with ratios.

For each named case (same data, same thread count):
- phase 2 steady state: device-resident tensors, a repeatable executor and a
  workspace allocated once; launch + synchronize;
- the end-to-end Pythonic call (NumPy in, NumPy out);
- PyTorch's `torch.ops.aten.*_backward` (channels_last for NHWC cases), when
  torch is installed; with `peers`, also torch.compile and JAX (bench_peers), and the
  ratio to the fastest peer of each case;
- before timing, every peer's largest difference from our result (a warning above
  PEER_DIFF_WARN: such a peer computes something else and is never the fastest);
- both ratios (PyTorch time / ours: > 1 means we are faster), the effective
  bandwidth (compulsory bytes / phase-2 time, GB/s) and its share of the copy
  bandwidth measured in the same run, and the workspace in bytes and as a share of the
  largest input.
Times are medians of `repeats` runs after a warm-up.  Also: thread scaling
(1 vs N threads) on the large cases, bitwise run-to-run and cross-thread
determinism, the host overhead of a tiny call, and compile times.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time

import numpy as np

from ..core import aclnn as A
from ..core.api import _check, grid_sampler_2d_backward
from ..ops.registry import OPERATORS
from ..runtime.device import Device, get_device
from .cases import Case, synchronised

__all__ = ["CASES", "QUICK", "BENCHES", "Case", "alternating_medians", "compulsory_bytes", "copy_bandwidth", "run_bench"]


# Each operator's benchmark module (its Operator's `bench`: bench_<op>.py) gives
#   CASES, QUICK                  its cases (cases.Case) and the names of the --quick subset;
#   inputs(case, rng)             the NumPy inputs, float32;
#   compulsory_bytes(case)        the bytes every implementation must move;
#   pythonic(case, arrays, device)   a function making the Pythonic call;
#   phase2(case, arrays, stream)  phase 1 on device tensors: (status, workspace bytes, executor,
#                                 phase-2 function, output tensors);
#   torch_op(case, tensors, torch)  a function calling PyTorch's aten op on the same tensors;
#   torch_compile(case, tensors, torch)  a function calling inductor's compiled form of the same;
#   jax_op(case, arrays)          a function computing the same with JAX, or None (no JAX form);
#   torch_step(case, torch, functional)  (forward, leaves, grad_output) of a training step, or
#                                 None for an operator whose training step another's covers.
BENCHES = {op.name: op.load("bench") for op in OPERATORS}
CASES = [c for b in BENCHES.values() for c in b.CASES]
QUICK = set().union(*(b.QUICK for b in BENCHES.values()))


def _times(fn, repeats: int, warmup: int) -> list:
    """Seconds of each of `repeats` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def _median_time(fn, repeats: int, warmup: int = 2) -> float:
    return float(np.median(_times(fn, repeats, warmup)))


# A block median more than this far above another block's median of the same function
# means the machine's speed changed during the measurement (other work sharing the cores).
BUSY_SPREAD = 0.20
# Two float32 implementations of one gradient: sums of up to thousands of terms in other
# orders differ by far less than this share of the largest value (checked on every case).
PEER_DIFF_WARN = 1e-3
spreads: dict = {}  # function label -> the largest relative spread of its block medians, per run


def alternating_medians(fns: dict, repeats: int, blocks: int = 3, warmup: int = 2) -> dict:
    """Median seconds of each function over `repeats` runs, taken in `blocks` alternating blocks
    (A A A, B B B, A A A, ...), so that drifts of a shared machine's speed reach every candidate.
    Blocks rather than single alternating runs: PyTorch's OpenMP workers keep spinning for a
    while after a call, which would slow down whatever runs right after it.  The spread of
    the block medians (max / min - 1) of each function is kept in `spreads`."""
    ts = {k: [] for k in fns}
    per_block = max(1, -(-repeats // blocks))
    block_medians = {k: [] for k in fns}
    for _ in range(blocks):
        for k, fn in fns.items():
            block = _times(fn, per_block, warmup)
            ts[k] += block
            block_medians[k].append(float(np.median(block)))
    for k, m in block_medians.items():
        spreads[k] = max(m) / min(m) - 1 if min(m) > 0 else 0.0
    return {k: float(np.median(v)) for k, v in ts.items()}


def busy_warnings(threads: int) -> list:
    """Lines warning that the machine looks busy: a load average above the thread count before
    the run, or block medians of one measurement more than BUSY_SPREAD apart."""
    lines = []
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    if load > threads:
        lines.append(f"warning: the load average is {load:.1f}, above the {threads} threads measured: other work "
                     "shares the cores, and the times below will move; judge on a quiet machine")
    return lines


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 10) -> float:
    """Host memory copy bandwidth in GB/s (bytes read + written), one NumPy copy."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    t = _median_time(lambda: np.copyto(dst, src), repeats)
    return 2 * nbytes / t / 1e9


def _inputs(case: Case, rng):
    return BENCHES[case.op].inputs(case, rng)


def compulsory_bytes(case: Case) -> int:
    """Bytes every implementation must move: inputs read once, outputs written once (float32)."""
    return BENCHES[case.op].compulsory_bytes(case)


def _pythonic(case: Case, arrays, device):
    return BENCHES[case.op].pythonic(case, arrays, device)


def _phase2(case: Case, arrays, device):
    """(run, workspace bytes, outputs): a repeatable executor on device-resident tensors."""
    st, stream = A.aclrtCreateStream(device)
    st, ws, ex, launch, outs = BENCHES[case.op].phase2(case, arrays, stream)
    _check(st)  # a failed call: its AclnnError (the CLI prints it as one line)
    A.aclSetAclOpExecutorRepeatable(ex)
    workspace = None
    if ws > 0:
        _, workspace = A.aclrtMalloc(ws, stream)

    def run():
        _check(launch(workspace, ws, ex, stream))
        A.aclrtSynchronizeStream(stream)

    return run, ws, outs


def _torch_fn(case: Case, arrays, torch, cuda: bool = False):
    """PyTorch's own op on the same data: on CPU tensors, or on CUDA tensors (`cuda`), then
    synchronised, so the time is the kernel's as ours is."""
    tensors = [torch.from_numpy(a) for a in arrays]
    if cuda:
        tensors = [t.cuda() for t in tensors]
    return synchronised(torch, BENCHES[case.op].torch_op(case, tensors, torch), cuda)


def _max_rel_diff(ours, theirs, layout: str) -> float:
    """Largest |ours - a peer's| over the largest |peer's|, over all outputs.  A PyTorch
    tensor's NHWC result is an NCHW-shaped view of channels_last memory: always transposed,
    since a shape comparison cannot tell N×C×H×W from N×H×W×C when H = W = C; other peers
    (NumPy, JAX arrays) come in our layout."""
    worst = 0.0
    theirs = theirs if isinstance(theirs, (tuple, list)) else (theirs,)
    for a, t in zip(ours, theirs):
        from_torch = hasattr(t, "detach")
        b = t.detach().cpu().numpy() if from_torch else np.asarray(t)
        if layout == "NHWC" and from_torch:
            b = b.transpose(0, 2, 3, 1)
        scale = max(float(np.abs(b).max()), np.finfo(np.float32).tiny)
        worst = max(worst, float(np.abs(a.astype(np.float64) - b).max()) / scale)
    return worst


def _usable_peers(out) -> tuple:
    """The peers of bench_peers that are installed here; says which are not and why."""
    from .bench_peers import available_peers
    from ..core.install import install_command
    names = []
    for peer, why in available_peers().items():
        if why is None:
            names.append(peer)
        else:
            out(f"peer {peer} left out: {why} ({install_command('bench')} adds it)")
    return tuple(names)


def _device_name(device) -> str:
    return device if isinstance(device, str) else device.name


def _first_line(e: Exception) -> str:
    """`e` in one line: its type and the first non-empty line of its message."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return type(e).__name__ + (f": {lines[0]}" if lines else "")


def _codegen_run(case: Case, arrays, device, first) -> tuple:
    """(run or None, max relative difference from ours or None, error or None): the linalg
    form's phase 2 of the case (IREE's own code generation; docs/kernel-design.md#forms), run
    once and compared with the tuned kernels' outputs `first`."""
    try:
        with A.scoped_form("linalg"):
            run, _, outs = _phase2(case, arrays, device)
        run()
    except Exception as e:  # noqa: BLE001 - e.g. lavapipe's loop budget: the column says why
        return None, None, _first_line(e)
    return run, _max_rel_diff(first, [o.numpy() for o in outs], case.layout), None


def run_case(case: Case, device, repeats: int, torch=None, rng=None, peers=(), codegen=False) -> dict:
    """Times one case beside PyTorch eager (`torch`, the module, when given) and the other
    `peers` (bench_peers.PEERS), and with `codegen` beside the linalg form of our kernel (IREE's
    own code generation: what the tuned forms gain); returns (a row of the results table, our
    outputs).  Every peer's numbers are compared with ours before timing; one that differs by
    more than PEER_DIFF_WARN is timed but never the fastest peer; one that fails on the case
    (its own error) is left out of it, with the error in the row."""
    rng = rng or np.random.default_rng(0)
    arrays = _inputs(case, rng)
    with A.scoped_form("tuned"):
        run, ws, outs = _phase2(case, arrays, device)
    run()
    first = [o.numpy() for o in outs]
    run()
    deterministic = all(np.array_equal(a, o.numpy()) for a, o in zip(first, outs))
    # End to end as users call it: the Pythonic layer with the device's name, so its small calls
    # run inline as theirs do (Operator.call_device: only the name "local-task" inlines; a Device
    # object, which fixes the worker count for phase 2 above, would wake the workers).
    fns = {"phase2": run, "e2e": _pythonic(case, arrays, _device_name(device))}
    peer_diff = None
    on_cuda = torch is not None and _device_name(device).startswith("cuda") and torch.cuda.is_available()
    if torch is not None:
        fns["torch"] = _torch_fn(case, arrays, torch, cuda=on_cuda)
        peer_diff = _max_rel_diff(first, fns["torch"](), case.layout)  # same numbers before timing
    peer_diffs, peer_errors = {}, {}
    for peer in peers:
        from .bench_peers import peer_function
        try:
            fn = peer_function(peer, case, arrays, cuda=on_cuda)
            if fn is not None:
                peer_diffs[peer] = _max_rel_diff(first, fn(), case.layout)
                fns[peer] = fn
        except Exception as e:  # noqa: BLE001 - a peer's own failure (an inductor bug) leaves it out
            peer_errors[peer] = _first_line(e)
    codegen_diff = codegen_error = None
    if codegen:
        run_linalg, codegen_diff, codegen_error = _codegen_run(case, arrays, device, first)
        if run_linalg is not None:
            fns["codegen"] = run_linalg
    spreads.clear()
    t = alternating_medians(fns, repeats)
    noisy = {k: v for k, v in spreads.items() if v > BUSY_SPREAD}
    largest = max(a.nbytes for a in arrays)
    row = {"case": case.name, "op": case.op, "layout": case.layout, "workspace_bytes": ws,
           "workspace_over_largest_input": ws / largest,
           "phase2_ms": 1e3 * t["phase2"], "e2e_ms": 1e3 * t["e2e"], "bitwise_repeatable": deterministic,
           "gbps": compulsory_bytes(case) / t["phase2"] / 1e9}
    if torch is not None:
        row.update(torch_ms=1e3 * t["torch"], ratio_phase2=t["torch"] / t["phase2"], ratio_e2e=t["torch"] / t["e2e"],
                   torch_device="cuda" if on_cuda else "cpu", torch_max_rel_diff=peer_diff)
    if codegen:
        row.update(codegen_ms=1e3 * t["codegen"] if "codegen" in t else None, codegen_max_rel_diff=codegen_diff,
                   codegen_error=codegen_error,
                   ratio_codegen=t["codegen"] / t["phase2"] if "codegen" in t else None)
    for peer in peers:
        row[f"{peer}_ms"] = 1e3 * t[peer] if peer in t else None
        row[f"{peer}_max_rel_diff"] = peer_diffs.get(peer)
        row[f"{peer}_error"] = peer_errors.get(peer)
    if peers:
        same = {k: t[k] for k in ("torch", *peers) if k in t
                and (row.get("torch_max_rel_diff") if k == "torch" else peer_diffs[k]) <= PEER_DIFF_WARN}
        if same:
            best = min(same, key=same.get)
            row.update(fastest_peer=best, ratio_fastest_e2e=same[best] / t["e2e"])
    row["unsteady"] = noisy  # measurements whose block medians moved more than BUSY_SPREAD
    return row, first


def _child_main(case_name: str, device: str, threads: int, repeats: int):
    """In a child process: phase-2 time of one case at `threads` workers (median of
    `repeats` runs after a warm-up), and a hash of its outputs."""
    import hashlib
    case = next(c for c in CASES if c.name == case_name)
    arrays = _inputs(case, np.random.default_rng(0))
    run, _, outs = _phase2(case, arrays, Device(device, threads=threads))
    run()
    h = hashlib.sha256(b"".join(o.numpy().tobytes() for o in outs)).hexdigest()
    print(json.dumps({"phase2_ms": 1e3 * _median_time(run, repeats), "sha256": h}))


def _in_child(case_name: str, device: str, threads: int, repeats: int) -> dict:
    import subprocess
    import sys
    code = f"from aclnn_iree.tools.bench import _child_main; _child_main({case_name!r}, {device!r}, {threads}, {repeats})"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_times(jobs: int, quick: bool, ops=None) -> dict:
    """Seconds to compile the CPU specialisations of `ops` (operator names; None: all) into an
    empty store, and the first of them alone (as on first use)."""
    from ..compiler.build import ArtifactStore
    from ..compiler.specs import all_specs
    from ..compiler.targets import TARGETS
    dtypes = ["float32"] if quick else None
    specs = list(all_specs(ops=ops, dtypes=dtypes))
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        ArtifactStore(d + "/one").build_one(specs[0], TARGETS["llvm-cpu"])
        one = time.perf_counter() - t
        res = ArtifactStore(d + "/all").build(specs, [TARGETS["llvm-cpu"]], jobs=jobs, progress=False)
    return {"one_specialisation_s": one, "all_specialisations_s": res.seconds, "count": res.compiled,
            "dtypes": ", ".join(dtypes) if dtypes else "all dtypes", "failed": len(res.failed)}


def tiny_overhead(device, repeats: int = 200) -> float:
    """Microseconds of one Pythonic call on a 1x1x4x4 case (host overhead), on the device named
    as users name it (run_case)."""
    x = np.ones((1, 1, 4, 4), np.float32)
    g = np.zeros((1, 4, 4, 2), np.float32)
    name = _device_name(device)
    return 1e6 * _median_time(lambda: grid_sampler_2d_backward(x, x, g, device=name), repeats, warmup=10)


# Bytes of one host <-> device transfer timed on GPUs (about the largest suite case's input).
TRANSFER_BYTES = 8 << 20


def transfer_rates(device: str, repeats: int = 10, torch=None) -> dict:
    """GB/s of a TRANSFER_BYTES upload and download on the GPU `device` (a driver name), as the
    Pythonic call moves NumPy arrays (Device.upload / download, `staged` or not as the device
    decides), beside the other kind of kernel memory (mapped where the device stages, and the
    reverse) and, for cuda, PyTorch's pageable `.cuda()` / `.cpu()` of the same bytes."""
    host = np.random.default_rng(0).integers(0, 256, TRANSFER_BYTES, dtype=np.uint8)
    ours = get_device(device)  # the device the calls use; the other kind of memory gets a device of its own
    rates = {"staged": ours.staged}
    for kind, dev in (("", ours), ("other_", Device(device, staged=not ours.staged))):
        buf = dev.upload(host)
        if dev.download(buf, host.nbytes).tobytes() != host.tobytes():
            raise RuntimeError(f"the {device} round trip changed the bytes")
        rates[kind + "upload_gbps"] = host.nbytes / _median_time(lambda: dev.upload(host), repeats) / 1e9
        rates[kind + "download_gbps"] = host.nbytes / _median_time(lambda: dev.download(buf, host.nbytes),
                                                                   repeats) / 1e9
    if torch is not None and device.startswith("cuda") and torch.cuda.is_available():
        t = torch.from_numpy(host)
        on_gpu = t.cuda()
        rates["torch_upload_gbps"] = host.nbytes / _median_time(lambda: (t.cuda(), torch.cuda.synchronize()),
                                                                repeats) / 1e9
        rates["torch_download_gbps"] = host.nbytes / _median_time(lambda: on_gpu.cpu(), repeats) / 1e9
    return rates


def run_bench(quick=False, threads=2, device="local-task", ops=None, repeats=10, json_path=None,
              compile=True, out=print, peers=False, codegen=False) -> dict:
    """Runs the suite and prints the table; returns all results (also written to `json_path`).
    `peers`: also torch.compile and JAX where installed (bench_peers), with the ratio to the
    fastest peer that computes our numbers; `codegen`: also the linalg form of each case (IREE's
    own code generation), with the tuned kernels' gain over it ("x cg": its time / ours)."""
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        from ..core.install import install_command
        torch = None
        out(f"torch is not installed: PyTorch columns are empty ({install_command('torch')} adds it)")
    for line in busy_warnings(threads):
        out(line)
    is_cpu = device.startswith("local")
    dev = Device(device, threads=threads) if is_cpu else device
    cases = [c for c in CASES if (not quick or c.name in QUICK) and (not ops or c.op in ops)]
    bw = copy_bandwidth()
    out(f"device {device}, {threads} threads; NumPy copy bandwidth {bw:.1f} GB/s; medians of {repeats} runs, "
        "ours and PyTorch's in alternating blocks")
    peer_names = _usable_peers(out) if peers else ()
    rows = []
    hdr = (f"{'case':40s} {'phase2 ms':>9s} {'e2e ms':>8s} {'torch ms':>9s} {'x p2':>6s} {'x e2e':>6s} "
           f"{'GB/s':>6s} {'%copy':>6s} {'ws B':>9s} {'ws/in':>6s}")
    hdr += "".join(f" {p + ' ms':>16s}" for p in peer_names) + (f" {'fastest':>13s} {'x best':>6s}" if peers else "")
    hdr += f" {'codegen ms':>10s} {'x cg':>6s}" if codegen else ""
    out(hdr)
    nan = float("nan")
    for case in cases:
        row, _ = run_case(case, dev, repeats, torch, peers=peer_names, codegen=codegen)
        row["share_of_copy"] = row["gbps"] / bw
        rows.append(row)
        line = (f"{case.name:40s} {row['phase2_ms']:9.2f} {row['e2e_ms']:8.2f} {row.get('torch_ms', nan):9.2f} "
                f"{row.get('ratio_phase2', nan):6.2f} {row.get('ratio_e2e', nan):6.2f} "
                f"{row['gbps']:6.2f} {100 * row['share_of_copy']:5.1f}% {row['workspace_bytes']:9d} "
                f"{row['workspace_over_largest_input']:6.2f}")
        line += "".join(f" {row[p + '_ms']:16.2f}" if row[p + "_ms"] is not None else f" {'n/a':>16s}"
                        for p in peer_names)
        if peers:
            line += f" {row.get('fastest_peer', '-'):>13s} {row.get('ratio_fastest_e2e', nan):6.2f}"
        if codegen:
            line += (f" {row['codegen_ms']:10.2f} {row['ratio_codegen']:6.2f}" if row["codegen_ms"] is not None
                     else f" {'n/a':>10s} {'':>6s}")
        out(line)
        if codegen and row["codegen_error"]:
            out(f"  note: the linalg form does not run this case: {row['codegen_error']}")
        elif codegen and (row["codegen_max_rel_diff"] or 0.0) > PEER_DIFF_WARN:
            out(f"  warning: the linalg form's result differs from ours by {row['codegen_max_rel_diff']:.1e} of "
                "its largest value")
        for who, key in [("PyTorch", "torch_max_rel_diff")] + [(p, p + "_max_rel_diff") for p in peer_names]:
            if (row.get(key) or 0.0) > PEER_DIFF_WARN:
                out(f"  warning: {who}'s result differs from ours by {row[key]:.1e} of its largest value: "
                    "the ratio compares different computations")
        for p in peer_names:
            if row.get(p + "_error"):
                out(f"  warning: {p} failed on this case and is left out of it: {row[p + '_error']}")
        for what, spread in row["unsteady"].items():
            out(f"  warning: {what} times moved {100 * spread:.0f} % between blocks (the machine looks busy)")
    result = {"device": device, "threads": threads, "copy_gbps": bw, "cases": rows}
    if torch is not None and rows:
        result["geomean_ratio_e2e"] = math.exp(np.mean([math.log(r["ratio_e2e"]) for r in rows]))
        result["geomean_ratio_phase2"] = math.exp(np.mean([math.log(r["ratio_phase2"]) for r in rows]))
        out(f"geometric mean speed-up vs PyTorch: end to end {result['geomean_ratio_e2e']:.2f}x, "
            f"phase 2 {result['geomean_ratio_phase2']:.2f}x")
    if codegen:
        gains = [r["ratio_codegen"] for r in rows if r.get("ratio_codegen")]
        if gains:
            result["geomean_ratio_codegen"] = math.exp(np.mean(np.log(gains)))
            out(f"the tuned kernels against IREE's own code generation (the linalg forms), phase 2: "
                f"{min(gains):.2f}x to {max(gains):.2f}x, geometric mean {result['geomean_ratio_codegen']:.2f}x "
                f"over {len(gains)} case(s)")
    for peer in peer_names:
        ratios = [r[peer + "_ms"] / r["e2e_ms"] for r in rows
                  if r[peer + "_ms"] is not None and r[peer + "_max_rel_diff"] <= PEER_DIFF_WARN]
        if ratios:
            g = math.exp(np.mean(np.log(ratios)))
            result[f"geomean_ratio_{peer}_e2e"] = g
            out(f"geometric mean speed-up vs {peer}: end to end {g:.2f}x over its {len(ratios)} case(s)")
    if peer_names:
        best = [r["ratio_fastest_e2e"] for r in rows if "ratio_fastest_e2e" in r]
        result["min_ratio_fastest_e2e"] = min(best) if best else None
        result["geomean_ratio_fastest_e2e"] = math.exp(np.mean(np.log(best))) if best else None
        if best:
            out(f"against the fastest peer of each case: at least {min(best):.2f}x, geometric mean "
                f"{result['geomean_ratio_fastest_e2e']:.2f}x (jax's grid sampler times include its forward; "
                "JAX runs on XLA's own thread pool, not --threads)")
    if is_cpu and threads > 1:
        # IREE reads the worker count once per process: each count runs in a child process,
        # three of each in alternation (one child's median can land in a slow spell of
        # this shared VM); the median of the three children's medians is reported.
        scaling = []
        for case in [c for c in cases if c.large]:
            kids = {1: [], threads: []}
            for _ in range(3):
                for n in kids:
                    kids[n].append(_in_child(case.name, device, n, repeats))
            t1, tn = (float(np.median([k["phase2_ms"] for k in kids[n]])) for n in (1, threads))
            same = len({k["sha256"] for ks in kids.values() for k in ks}) == 1
            scaling.append({"case": case.name, "speedup": t1 / tn, "ms_1": t1, f"ms_{threads}": tn,
                            "same_bits": same})
            out(f"threads 1 -> {threads}: {case.name:40s} {t1 / tn:.2f}x "
                f"({t1:.2f} -> {tn:.2f} ms), bitwise identical across thread counts and runs: {same}")
        result["thread_scaling"] = scaling
    result["tiny_call_us"] = tiny_overhead(dev)
    out(f"host overhead, Pythonic call on 1x1x4x4: {result['tiny_call_us']:.0f} us")
    if not is_cpu:
        r = result["transfers"] = transfer_rates(device, torch=torch)
        ours, other = ("staged", "mapped") if r["staged"] else ("mapped", "staged")
        line = (f"host <-> {device} transfers of {TRANSFER_BYTES >> 20} MiB (NumPy arrays): upload "
                f"{r['upload_gbps']:.2f} GB/s, download {r['download_gbps']:.2f} GB/s ({ours}, as the calls move "
                f"them); {other}: {r['other_upload_gbps']:.2f} / {r['other_download_gbps']:.2f} GB/s")
        if "torch_upload_gbps" in r:
            line += f"; PyTorch .cuda() / .cpu(): {r['torch_upload_gbps']:.2f} / {r['torch_download_gbps']:.2f} GB/s"
        out(line)
    if compile:
        ct = compile_times(jobs=threads, quick=quick, ops=ops)
        result["compile"] = ct
        out(f"compile: one specialisation {ct['one_specialisation_s']:.2f} s; all {ct['count']} CPU "
            f"specialisations ({ct['dtypes']}) {ct['all_specialisations_s']:.1f} s on {threads} jobs")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
        out(f"results written to {json_path}")
    return result
