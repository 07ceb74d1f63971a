"""torch.profiler sees our kernels: each call of one of them is an event named
"aclnn_iree::<op> (IREE <device>)" (_bridge.event_name), through the custom ops, the drop-in
functions (forward and autograd's backward) and enable()'s aten kernels, on a signature's first
call (the general path) and on its repeats (its Plan); no such event where PyTorch's kernel ran
instead; and no event object at all while no profiler records."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import aclnn_iree.torch as AT  # noqa: E402
from aclnn_iree.core.errors import AclnnError  # noqa: E402
from aclnn_iree.torch import _bridge  # noqa: E402

OPS = ("grid_sampler_2d", "grid_sampler_2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """No plans yet (a signature's first call takes the general path), the default CPU device
    (restored after) and enable() off after."""
    monkeypatch.setattr(_bridge, "_tls", _bridge._Plans())
    monkeypatch.setattr(_bridge, "_cpu_device", "local-task")
    was = AT.is_enabled()
    yield
    (AT.enable if was else AT.disable)()


def _events(fn, repeat=1):
    """{event name: count} of the events naming aclnn_iree while `fn` runs `repeat` times under the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeat):
            fn()
    return {e.key: e.count for e in prof.key_averages() if "aclnn_iree" in e.key}


def _ours(events):
    """{op: count} of the kernel events (not the custom ops' own dispatcher events, which a call
    that falls back to PyTorch's kernel records too), checking their names' form."""
    ops = {}
    for name, count in events.items():
        if " (IREE " not in name:
            continue
        op, device = name[len("aclnn_iree::"):].split(" (IREE ")
        assert name.startswith("aclnn_iree::") and device.endswith(")") and op in OPS, name
        ops[op] = ops.get(op, 0) + count
    return ops


def _inputs():
    x = torch.randn(1, 2, 5, 6, requires_grad=True)
    grid = (torch.rand(1, 3, 4, 2) * 2 - 1).requires_grad_()
    return x, grid


def test_drop_in_functions_forward_and_backward():
    x, grid = _inputs()

    def step():
        AT.grid_sample(x, grid, align_corners=False).sum().backward()
        AT.interpolate(x, size=(7, 9), mode="bilinear").sum().backward()
    assert _ours(_events(step)) == dict.fromkeys(OPS, 1)  # general path
    assert _ours(_events(step, repeat=3)) == dict.fromkeys(OPS, 3)  # plans


def test_custom_ops():
    x, grid = _inputs()
    go = torch.randn(1, 2, 3, 4)
    ops = torch.ops.aclnn_iree

    def calls():
        ops.grid_sampler_2d(x, grid, 0, 0, False)
        ops.grid_sampler_2d_backward(go, x, grid, 0, 0, False, [True, False])
        ops.upsample_bilinear2d(x, [7, 9], False)
        ops.upsample_bilinear2d_backward(torch.randn(1, 2, 7, 9), [7, 9], [1, 2, 5, 6], False)
    assert _ours(_events(calls, repeat=2)) == dict.fromkeys(OPS, 2)


def test_enabled_overrides_and_nothing_outside():
    x, grid = _inputs()

    def step():
        F.grid_sample(x, grid, align_corners=False).sum().backward()
        F.interpolate(x, size=(7, 9), mode="bilinear").sum().backward()

    def under_enabled():
        with AT.enabled():
            step()
    assert _ours(_events(under_enabled, repeat=2)) == dict.fromkeys(OPS, 2)
    assert not AT.is_enabled()
    assert _events(step) == {}  # PyTorch's kernels: no aclnn_iree event of any kind


def test_no_event_where_pytorch_kernel_runs():
    """enable() passes an upsample whose scale disagrees with the sizes to PyTorch's kernel."""
    x = torch.randn(1, 2, 5, 6)

    def call():
        with AT.enabled():
            torch.ops.aten.upsample_bilinear2d(x, [7, 9], False, 2.0, 2.0)  # 5 * 2.0 != 7
            torch.ops.aten.upsample_bilinear2d(x, [7, 9], False)
    assert _ours(_events(call)) == {"upsample_bilinear2d": 1}


def test_event_name_names_the_device():
    AT.set_cpu_device("local-sync")  # restored by `fresh`
    x = torch.ones(1, 1, 4, 4)
    g = torch.zeros(1, 4, 4, 2)
    events = _events(lambda: torch.ops.aclnn_iree.grid_sampler_2d_backward(x, x, g, 0, 0, False, [True, True]), 2)
    assert events["aclnn_iree::grid_sampler_2d_backward (IREE local-sync)"] == 2
    assert _bridge.event_name("grid_sampler_2d_backward", "local-sync") \
        == "aclnn_iree::grid_sampler_2d_backward (IREE local-sync)"


def test_failed_call_closes_its_event():
    """An aclnn refusal inside the event (phase 1) neither breaks the profile nor later events."""
    x, grid = torch.randn(1, 2, 5, 6), torch.zeros(1, 3, 4, 2)
    go = torch.randn(1, 2, 3, 5)  # grid says 3x4

    def calls():
        with pytest.raises(AclnnError):
            torch.ops.aclnn_iree.grid_sampler_2d_backward(go, x, grid, 0, 0, False, [True, True])
        torch.ops.aclnn_iree.grid_sampler_2d(x, grid, 0, 0, False)
    assert _ours(_events(calls)) == {"grid_sampler_2d_backward": 1, "grid_sampler_2d": 1}


def test_no_event_object_without_a_profiler(monkeypatch):
    """The host-bound fast path pays only the profiler check while none records."""
    made = []

    real = _bridge._RecordFunctionFast

    def spy(name):
        made.append(name)
        return real(name)
    monkeypatch.setattr(_bridge, "_RecordFunctionFast", spy)
    x, grid = _inputs()
    for _ in range(2):  # the general path, then the plans
        AT.grid_sample(x, grid).sum().backward()
        AT.interpolate(x, scale_factor=2.0).sum().backward()
    assert made == []
    with profile(activities=[ProfilerActivity.CPU]):
        AT.grid_sample(x, grid).sum().backward()
    assert sorted(name.split(" (IREE ")[0] for name in made) == [f"aclnn_iree::{op}" for op in OPS[:2]]
