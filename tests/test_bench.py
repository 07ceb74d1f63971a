"""The benchmark checks that PyTorch computes the same numbers before it times it (its
ratios compare like with like).  Timings themselves are never asserted here."""
from __future__ import annotations

import numpy as np
import pytest

from aclnn_iree.tools import bench

torch = pytest.importorskip("torch")

SMALL = [bench.Case("grid_reflection_small", "grid_sampler_2d_backward", (2, 3, 9, 11, 7, 5), 0, 2, False),
         bench.Case("up_nhwc_small", "upsample_bilinear2d_backward", (2, 5, 6, 7, 13, 10), layout="NHWC"),
         # H = W = C: the NHWC result has PyTorch's NCHW shape, and must still be transposed.
         bench.Case("up_nhwc_square", "upsample_bilinear2d_backward", (2, 4, 4, 4, 8, 8), layout="NHWC"),
         bench.Case("fwd_grid_bicubic_small", "grid_sampler_2d", (2, 3, 9, 11, 7, 5), 2, 1, True),
         bench.Case("fwd_up_nhwc_small", "upsample_bilinear2d", (2, 5, 6, 7, 13, 10), layout="NHWC")]
FORWARD = SMALL[3:]


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_each_row_says_how_far_pytorch_is_from_ours(case):
    row, ours = bench.run_case(case, "local-task", repeats=1, torch=torch)
    assert row["torch_device"] == "cpu"
    assert 0.0 <= row["torch_max_rel_diff"] < bench.PEER_DIFF_WARN
    assert row["torch_ms"] > 0 and row["ratio_e2e"] > 0
    # The check sees a difference where there is one (and reads NHWC results in NHWC).
    theirs = bench._torch_fn(case, bench._inputs(case, np.random.default_rng(0)), torch)()
    planted = [o.copy() for o in ours]
    planted[0].flat[3] += 0.01 * np.abs(planted[0]).max()
    assert bench._max_rel_diff(planted, theirs, case.layout) > bench.PEER_DIFF_WARN


def test_end_to_end_calls_run_as_users_call_them(monkeypatch):
    """The suite passes phase 2 a Device (its worker count); the e2e column and the tiny-call
    overhead call the Pythonic layer with the device's name, as users do, so small calls take
    the inline path users get (api.call_device), not a wake-up of the task workers."""
    from aclnn_iree.ops import Operator
    from aclnn_iree.runtime.device import Device
    asked, chosen = [], []
    real = Operator.call_device

    def spy(self, device, work, kind=""):
        asked.append(device)
        chosen.append(real(self, device, work, kind))
        return chosen[-1]
    monkeypatch.setattr(Operator, "call_device", spy)
    dev = Device("local-task", threads=2)
    bench.run_case(SMALL[1], dev, repeats=1)
    assert asked and all(d == "local-task" for d in asked), asked
    assert set(chosen) == {"local-sync"}  # a small case: inline
    asked.clear()
    bench.tiny_overhead(dev, repeats=1)
    assert asked and all(d == "local-task" for d in asked), asked


def test_peers_compute_our_numbers_and_the_fastest_is_among_them(monkeypatch):
    """torch.compile (and JAX where installed) are timed beside us after their numbers are
    checked; a peer that computes something else is timed but never the fastest."""
    from aclnn_iree.tools import bench_peers
    peers = tuple(p for p, why in bench_peers.available_peers().items() if why is None)
    assert "torch_compile" in peers  # torch is installed here
    case = SMALL[0]
    row, _ = bench.run_case(case, "local-task", repeats=1, torch=torch, peers=peers)
    for p in peers:
        assert row[p + "_ms"] > 0 and row[p + "_max_rel_diff"] < bench.PEER_DIFF_WARN, p
    assert row["fastest_peer"] in ("torch",) + peers and row["ratio_fastest_e2e"] > 0
    # A peer with wrong numbers (and an impossible speed) is reported, never the fastest.
    real = bench_peers.peer_function

    def wrong(peer, case, arrays, cuda=False):
        fn = real(peer, case, arrays, cuda)
        return lambda: tuple(2 * t.detach() for t in fn())
    monkeypatch.setattr(bench_peers, "peer_function", wrong)
    row, _ = bench.run_case(case, "local-task", repeats=1, torch=torch, peers=("torch_compile",))
    assert row["torch_compile_max_rel_diff"] > bench.PEER_DIFF_WARN
    assert row["fastest_peer"] == "torch"


def test_a_failing_peer_is_left_out_of_its_case(monkeypatch):
    """A peer that raises on a case (inductor fails on some shapes) is reported in the row
    and left out of that case: never timed, never the fastest; the benchmark goes on."""
    from aclnn_iree.tools import bench_peers

    def failing(peer, case, arrays, cuda=False):
        def fn():
            raise RuntimeError("AssertionError in codegen\nlong traceback")
        return fn
    monkeypatch.setattr(bench_peers, "peer_function", failing)
    row, _ = bench.run_case(SMALL[0], "local-task", repeats=1, torch=torch, peers=("torch_compile",))
    assert row["torch_compile_ms"] is None
    assert row["torch_compile_error"] == "RuntimeError: AssertionError in codegen"
    assert row["fastest_peer"] == "torch" and row["ratio_fastest_e2e"] > 0


def test_torch_bench_leaves_out_a_failing_compiled_row(monkeypatch):
    """Inductor's codegen fails on some shapes (it asserts on 2 x 32 x 2000 x 1): the training
    step table records the error, warns in one line and leaves that row's cell out, and the
    other rows of the case are still timed and checked."""
    from aclnn_iree.tools import bench_torch
    real = bench_torch._step

    def step(case, torch, F, AT, ours, compiled):
        fn = real(case, torch, F, AT, ours, compiled)
        if compiled and not ours:
            def fails():
                raise RuntimeError("codegen failed\nsecond line")
            return fails
        return fn

    monkeypatch.setattr(bench_torch, "_step", step)
    monkeypatch.setattr(bench_torch, "CASES", [c for c in bench_torch.CASES if c.name in bench_torch.QUICK][:2])
    monkeypatch.setattr(bench_torch, "custom_op_overhead_us",
                        lambda torch: {"iree_us": 0.5, "custom_op_us": 2.0, "pythonic_us": 1.0, "host_us": 1.0,
                                       "below_autograd_us": 1.5, "custom_op_host_us": 1.5, "step_us": 3.0,
                                       "torch_step_us": 1.0, "step_ratio": 3.0})
    lines = []
    rows = bench_torch.run_torch_bench(quick=True, repeats=1, out=lines.append)["training_steps"]
    assert len(rows) == 2
    for r in rows:
        assert r["failed"] == {"compiled": "RuntimeError: codegen failed"} and r["ratio_compiled"] is None
        assert "compiled_ms" not in r and r["ours_ms"] > 0 and r["ours_compiled_ms"] > 0 and r["ratio_eager"] > 0
    assert sum("compiled failed on this case and is left out of it" in line for line in lines) == 2


def test_custom_op_overhead_measures_both_paths():
    """The torch layer's host cost is measured for a direct call of the op and for the call
    autograd's first-order backward makes (below the op's autograd wrapper), each over IREE's
    own invoke and wait of the same kernel (which computes the same gradients), beside the
    Pythonic call, and a tiny training step beside PyTorch's; the Pythonic device setting is
    restored afterwards."""
    torch = pytest.importorskip("torch")
    from aclnn_iree.tools import bench_torch
    from aclnn_iree.torch import _bridge
    before = _bridge.get_cpu_device()
    r = bench_torch.custom_op_overhead_us(torch, repeats=3, blocks=2)
    assert set(r) == {"iree_us", "custom_op_us", "below_autograd_us", "pythonic_us", "host_us",
                      "custom_op_host_us", "step_us", "torch_step_us", "step_ratio"}
    assert min(r["iree_us"], r["custom_op_us"], r["below_autograd_us"], r["pythonic_us"], r["step_us"],
               r["torch_step_us"], r["step_ratio"]) > 0
    # every layer does at least IREE's own call (a generous margin for a noisy machine)
    assert min(r["custom_op_us"], r["below_autograd_us"], r["pythonic_us"]) > 0.8 * r["iree_us"]
    assert _bridge.get_cpu_device() == before


def test_iree_floor_computes_the_gradients():
    """The floor the torch layer's host cost is measured over is a real call of the kernel:
    on random data its outputs are PyTorch's gradients (float32 bound), and a second call
    (as the benchmark repeats it) writes them again."""
    torch = pytest.importorskip("torch")
    from aclnn_iree.tools import bench_torch
    rng = np.random.default_rng(3)
    go, x = rng.standard_normal((2, 1, 1, 4, 4), dtype=np.float32)
    grid = rng.uniform(-1.2, 1.2, (1, 4, 4, 2)).astype(np.float32)
    call, (dx, dg) = bench_torch.iree_floor(go, x, grid)
    want = torch.ops.aten.grid_sampler_2d_backward(torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(grid),
                                                   0, 0, False, [True, True])
    for _ in range(2):
        call()
        for got, ref in zip((dx.numpy(), dg.numpy()), want):
            np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)


def test_gpu_transfer_rates_time_both_kinds_of_memory():
    """On a GPU the bench reports host <-> device rates of both kinds of kernel memory (the
    one the device uses and the other), each after checking its round trip keeps the bytes."""
    from conftest import require_device
    require_device("vulkan")
    from aclnn_iree.runtime.device import Device
    r = bench.transfer_rates("vulkan", repeats=2)
    assert r["staged"] == Device("vulkan").staged
    assert min(r[k] for k in ("upload_gbps", "download_gbps", "other_upload_gbps", "other_download_gbps")) > 0


@pytest.mark.parametrize("case", FORWARD, ids=lambda c: c.name)
def test_forward_cases_beside_their_peers(case):
    """The forward operators' rows: PyTorch's aten forward and torch.compile checked against ours
    before timing (JAX where installed: it has no bicubic grid sample nor align_corners resize)."""
    from aclnn_iree.tools import bench_peers
    peers = tuple(p for p, why in bench_peers.available_peers().items() if why is None)
    row, ours = bench.run_case(case, "local-task", repeats=1, torch=torch, peers=peers)
    assert row["torch_max_rel_diff"] < bench.PEER_DIFF_WARN and row["torch_compile_max_rel_diff"] < bench.PEER_DIFF_WARN
    assert row["op"] == case.op and len(ours) == 1


def test_compile_times_follow_the_chosen_operators():
    """`bench --op X` times the compile of X's specialisations only (it had compiled every
    operator's), each compiled afresh into an empty store."""
    from aclnn_iree.compiler.specs import all_specs
    r = bench.compile_times(jobs=2, quick=True, ops=["upsample_bilinear2d"])
    want = len(list(all_specs(ops=["upsample_bilinear2d"], dtypes=["float32"])))
    assert r["count"] == want and want > 0 and r["failed"] == 0 and r["dtypes"] == "float32"
    assert r["one_specialisation_s"] > 0 and r["all_specialisations_s"] > 0


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_codegen_column_times_the_linalg_form_of_the_case(case):
    """--codegen: the linalg form of the same call, compared with ours before it is timed; its
    time over ours is what the tuned kernels gain over IREE's own code generation."""
    row, ours = bench.run_case(case, "local-task", repeats=1, codegen=True)
    assert row["codegen_error"] is None
    assert row["codegen_max_rel_diff"] < 1e-5
    assert row["codegen_ms"] > 0 and row["ratio_codegen"] == pytest.approx(row["codegen_ms"] / row["phase2_ms"])
