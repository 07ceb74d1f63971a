"""The torch layer's repeated calls (aclnn_iree.torch._bridge.Plan): a signature's first call in a
thread takes the general path and leaves a plan; the next calls launch the kept kernel straight
on their own tensors.  Oracle: the Pythonic call on the same data (our kernels through the
general path, itself checked against the float64 reference and PyTorch elsewhere), bit for
bit, for every call of a sequence with fresh data each time."""
from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import aclnn_iree  # noqa: E402
import aclnn_iree.torch as AT  # noqa: E402
from aclnn_iree.core import api  # noqa: E402
from aclnn_iree.core.errors import AclnnError  # noqa: E402
from aclnn_iree.runtime import kernels  # noqa: E402
from aclnn_iree.torch import _bridge  # noqa: E402

OPS = torch.ops.aclnn_iree
GENERAL = ("run_grid_sampler", "run_grid_sampler_forward", "run_upsample", "run_upsample_forward")


@pytest.fixture
def general(monkeypatch):
    """The names of the api.run_* functions the torch layer called (its general path: the calls
    that may leave a plan, `kept`), in order; no plans yet."""
    monkeypatch.setattr(_bridge, "_tls", _bridge._Plans())
    calls = []

    def spy(name, real):
        def run(*a, **k):
            if k.get("kept") is not None:
                calls.append(name)
            return real(*a, **k)
        return run
    for name in GENERAL:
        monkeypatch.setattr(api, name, spy(name, getattr(api, name)))
    return calls


def _np(t):
    t = t.detach()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def _bits(a, b, what):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape and a.tobytes() == b.tobytes(), f"{what}: not the Pythonic call's bits"


def _grid_calls(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 6, 7, generator=g).to(dtype)
    grid = (torch.rand(2, 4, 5, 2, generator=g) * 2.4 - 1.2).to(dtype)
    go = torch.randn(2, 3, 4, 5, generator=g).to(dtype)
    return x, grid, go


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("mode,pad,ac", [(0, 0, False), (1, 1, True), (2, 2, False)])
def test_repeated_grid_sampler_calls_run_their_plan_on_each_calls_data(general, dtype, mode, pad, ac):
    for k in range(4):
        x, grid, go = _grid_calls(dtype, seed=10 * k + mode)
        out = OPS.grid_sampler_2d(x, grid, mode, pad, ac)
        _bits(_np(out), aclnn_iree.grid_sampler_2d(_np(x), _np(grid), mode, pad, ac, device="local-sync"),
              f"forward, call {k}")
        for mask in ([True, True], [True, False], [False, True]):
            dx, dg = OPS.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, mask)
            want = aclnn_iree.grid_sampler_2d_backward(_np(go), _np(x), _np(grid), mode, pad, ac, tuple(mask),
                                                       device="local-sync")
            for got, ref, m in zip((dx, dg), want, mask):
                if m:
                    _bits(_np(got), ref, f"backward {mask}, call {k}")
                else:
                    assert got.numel() == 0
    # the general path once per signature (the forward, three masks), then the plans
    assert general == ["run_grid_sampler_forward"] + ["run_grid_sampler"] * 3


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_repeated_upsample_calls_run_their_plan_on_each_calls_data(general, layout, dtype):
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    perm = (0, 2, 3, 1) if layout == "NHWC" else (0, 1, 2, 3)
    for k in range(4):
        g = torch.Generator().manual_seed(k)
        x = torch.randn(2, 3, 5, 7, generator=g).to(dtype).contiguous(memory_format=fmt)
        go = torch.randn(2, 3, 9, 11, generator=g).to(dtype).contiguous(memory_format=fmt)
        y = OPS.upsample_bilinear2d(x, [9, 11], False, 1.8, None)
        dx = OPS.upsample_bilinear2d_backward(go, [9, 11], [2, 3, 5, 7], False, 1.8, None)
        assert y.is_contiguous(memory_format=fmt) and dx.is_contiguous(memory_format=fmt)
        _bits(_np(y.permute(*perm)), aclnn_iree.upsample_bilinear2d(
            _np(x.permute(*perm)), (9, 11), False, 1.8, None, memory_format=layout, device="local-sync"),
            f"forward, call {k}")
        isz = (2, 5, 7, 3) if layout == "NHWC" else (2, 3, 5, 7)
        _bits(_np(dx.permute(*perm)), aclnn_iree.upsample_bilinear2d_backward(
            _np(go.permute(*perm)), (9, 11), isz, False, 1.8, None, memory_format=layout, device="local-sync"),
            f"backward, call {k}")
    assert general == ["run_upsample_forward", "run_upsample"]


def test_training_steps_through_the_functions_use_their_plans(general):
    """A training step's forward and backward calls through the drop-in functions: after the
    first step, no call takes the general path, and the gradients are PyTorch's (within
    float32 rounding of its own)."""
    for k in range(3):
        g = torch.Generator().manual_seed(k)
        xa = torch.randn(1, 2, 6, 6, generator=g, requires_grad=True)
        grid = (torch.rand(1, 5, 5, 2, generator=g) * 2 - 1).requires_grad_()
        out = AT.grid_sample(AT.interpolate(xa, size=(8, 8), mode="bilinear"), grid, align_corners=False)
        out.square().sum().backward()
        xb, gb = xa.detach().clone().requires_grad_(), grid.detach().clone().requires_grad_()
        ref = torch.nn.functional.grid_sample(torch.nn.functional.interpolate(xb, size=(8, 8), mode="bilinear"), gb,
                                              align_corners=False)
        ref.square().sum().backward()
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(grid.grad, gb.grad)
    assert sorted(general) == sorted(GENERAL)  # each op once: the first step


def test_memory_a_plan_cannot_import_takes_the_general_path(general):
    """An input off the 64-byte boundary DLPack imports need (a view at an offset) goes the
    general way (a NumPy-view import), with the same bits as an aligned copy."""
    x, grid, _ = _grid_calls(torch.float32, seed=3)
    OPS.grid_sampler_2d(x, grid, 0, 0, False)
    base = torch.empty(x.numel() + 4)
    shifted = base[4:].view(x.shape)  # 16 bytes past PyTorch's 64-byte aligned allocation
    shifted.copy_(x)
    assert shifted.data_ptr() % 64 == 16
    _bits(_np(OPS.grid_sampler_2d(shifted, grid, 0, 0, False)), _np(OPS.grid_sampler_2d(x, grid, 0, 0, False)),
          "shifted input")
    assert general == ["run_grid_sampler_forward"] * 2  # the first call, and the shifted one


def test_negated_views_are_read_as_their_values(general):
    """A tensor with PyTorch's lazy negative bit (torch._neg_view: its memory holds -t)
    is read as its values on the general path and never by a plan (DLPack exports the raw
    memory): the same results as PyTorch's on -x, first call and repeats alike."""
    import torch.nn.functional as F
    x, grid, go = _grid_calls(torch.float32, 11)
    n = torch._neg_view(x)
    assert n.is_neg()
    for _ in range(3):  # the first call leaves plans; the repeats must not read the raw memory
        torch.testing.assert_close(AT.grid_sample(n, grid, align_corners=False),
                                   F.grid_sample(-x, grid, align_corners=False), rtol=0, atol=0)
        torch.testing.assert_close(AT.interpolate(n, size=(9, 5), mode="bilinear", align_corners=False),
                                   F.interpolate(-x, size=(9, 5), mode="bilinear", align_corners=False),
                                   rtol=0, atol=0)
        dx, dg = OPS.grid_sampler_2d_backward(torch._neg_view(go), x, grid, 0, 0, False, [True, True])
        ex, eg = torch.ops.aten.grid_sampler_2d_backward(-go, x, grid, 0, 0, False, [True, True])
        torch.testing.assert_close(dx, ex)
        torch.testing.assert_close(dg, eg)


@pytest.mark.parametrize("shape", [(2, 5, 1, 1), (2, 5, 1, 7), (1, 5, 3, 1), (2, 1, 4, 4)])
def test_ambiguous_layouts_follow_pytorchs_choice(shape):
    """A channels_last tensor with size-1 dimensions is contiguous both ways; PyTorch decides
    by its strides (suggest_memory_format) and so do we: interpolate's output and its
    gradient take PyTorch's layout (the (N, C, 1, 1) of a pooled branch had come back NCHW)."""
    import torch.nn.functional as F
    x = torch.randn(*shape).to(memory_format=torch.channels_last).requires_grad_()
    xr = x.detach().clone().to(memory_format=torch.channels_last).requires_grad_()
    y = AT.interpolate(x, size=(3, 4), mode="bilinear", align_corners=False)
    yr = F.interpolate(xr, size=(3, 4), mode="bilinear", align_corners=False)
    assert y.stride() == yr.stride() and torch.equal(y, yr)
    go = torch.randn_like(yr)
    y.backward(go)
    yr.backward(go)
    assert x.grad.stride() == xr.grad.stride()
    torch.testing.assert_close(x.grad, xr.grad)


def test_plans_are_per_thread_and_forget_unloaded_modules(general):
    x, grid, _ = _grid_calls(torch.float32, seed=4)
    want = _np(OPS.grid_sampler_2d(x, grid, 0, 1, True)).copy()
    OPS.grid_sampler_2d(x, grid, 0, 1, True)
    assert general == ["run_grid_sampler_forward"]
    got = []
    t = threading.Thread(target=lambda: got.append(_np(OPS.grid_sampler_2d(x, grid, 0, 1, True)).copy()))
    t.start()
    t.join()
    _bits(got[0], want, "another thread")
    assert general == ["run_grid_sampler_forward"] * 2  # that thread's first call: its own stream and plan
    kernels.unload_modules()
    _bits(_np(OPS.grid_sampler_2d(x, grid, 0, 1, True)), want, "after unload_modules")
    assert general == ["run_grid_sampler_forward"] * 3


def test_a_failed_launch_forgets_its_plan(general, monkeypatch):
    """A launch that fails raises AclnnError and takes the thread's plans with it (their stream
    failed for good): the next call of each signature makes a new stream and plan, and
    computes (another signature's plan once failed once more on the old stream)."""
    x, grid, _ = _grid_calls(torch.float32, seed=5)
    up = _np(OPS.upsample_bilinear2d(x, [7, 9], False, None, None)).copy()  # a second signature's plan
    want = _np(OPS.grid_sampler_2d(x, grid, 1, 0, False)).copy()
    real = kernels.Kernel.fenced_call

    def failing(self, args, wait, signal):
        monkeypatch.setattr(kernels.Kernel, "fenced_call", real)
        signal.fail("injected device failure")
        return real(self, args, wait, signal)
    monkeypatch.setattr(kernels.Kernel, "fenced_call", failing)
    with pytest.raises(AclnnError, match="launch failed"):
        OPS.grid_sampler_2d(x, grid, 1, 0, False)
    _bits(_np(OPS.upsample_bilinear2d(x, [7, 9], False, None, None)), up, "the other signature after it")
    _bits(_np(OPS.grid_sampler_2d(x, grid, 1, 0, False)), want, "after the failure")
    assert general == ["run_upsample_forward", "run_grid_sampler_forward"] * 2


def test_dispatch_modes_see_our_ops():
    """Under a dispatch mode (FakeTensorMode, FlopCounterMode, a tracer) the functions call our
    ops through the dispatcher, forward and backward, rather than their Python kernels."""
    from torch.utils._python_dispatch import TorchDispatchMode
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    grid = (torch.rand(1, 4, 4, 2) * 2 - 1).requires_grad_()
    with Record():
        AT.grid_sample(AT.interpolate(x, size=(6, 6), mode="bilinear"), grid, align_corners=True).sum().backward()
    for op in ("aclnn_iree.upsample_bilinear2d", "aclnn_iree.grid_sampler_2d", "aclnn_iree.grid_sampler_2d_backward",
               "aclnn_iree.upsample_bilinear2d_backward"):
        assert op in seen, (op, seen)


class _FlippingEnviron:
    """os.environ's stand-in whose ACLNN_IREE_FORM reads `values` in turn (then the last one):
    the variable changed by another thread between two reads of one call."""

    def __init__(self, values):
        self.values = list(values)

    def get(self, name, default=None):
        if name != "ACLNN_IREE_FORM":
            return __import__("os").environ.get(name, default)
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


@pytest.mark.parametrize("call", ["interpolate", "grid_sample"])
def test_a_call_takes_one_form_for_its_plan_and_its_kernel(general, monkeypatch, call):
    """ACLNN_IREE_FORM changing while a call runs (another thread sets it) must not leave a plan
    keyed by one form that launches the other form's kernel, for good: each call reads the
    form once, and its key, its executor and its plan all take that one.  Seen: the key read
    "linalg", phase 1 read "tuned" a moment later.  The forms differ observably in subnormals:
    the linalg form's CPU executors flush them, the tuned kernels keep them."""
    from aclnn_iree.core import aclnn as A
    tiny = float(np.finfo(np.float32).smallest_normal) / 4  # a float32 subnormal
    x = torch.full((1, 1, 4, 4), tiny)
    grid = torch.zeros(1, 4, 4, 2)  # every point at the centre: bilinear of four subnormals

    def run():
        if call == "interpolate":
            return AT.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False)
        return AT.grid_sample(x, grid, align_corners=False)
    monkeypatch.setattr(A, "os", type("os", (), {"environ": _FlippingEnviron(["linalg", "tuned"])}))
    first = run()  # the general path: the key reads "linalg", every later read "tuned"
    monkeypatch.setattr(A, "os", type("os", (), {"environ": _FlippingEnviron(["linalg"])}))
    again = run()  # the plan the first call left under "linalg"
    assert general, "the first call took the general path"
    for y in (first, again):
        assert torch.all(y == 0), f"a call keyed by the linalg form ran the tuned kernel: {y.flatten()[:4]}"
    monkeypatch.setattr(A, "os", type("os", (), {"environ": _FlippingEnviron(["tuned"])}))
    assert torch.all(run() == tiny), "the tuned form keeps subnormals"


def test_repeated_calls_compute_on_the_inputs_device_whatever_the_default_device(general):
    """A default device set by torch.set_default_device or a `with torch.device(...)` block does
    not move a repeated call's output off its CPU inputs: each call gives F's result on the CPU,
    NCHW and channels_last (the plan's output once landed on the default device and was
    imported as host memory: a segfault with "meta")."""
    import torch.nn.functional as F
    x, grid, _ = _grid_calls(torch.float32, seed=9)
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf = x.contiguous(memory_format=fmt)
        want = (F.interpolate(xf, size=(7, 9), mode="bilinear"), F.grid_sample(xf, grid, align_corners=False))
        for block in range(3):
            with torch.device("meta"):
                got = (AT.interpolate(xf, size=(7, 9), mode="bilinear"), AT.grid_sample(xf, grid, align_corners=False))
            for g, w in zip(got, want):
                assert g.device.type == "cpu"
                torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    # the first call of each layout of interpolate and one of grid_sample (which reads its input
    # contiguous: both layouts share its plan); the rest ran their plans
    assert sorted(general) == ["run_grid_sampler_forward"] + ["run_upsample_forward"] * 2


def test_a_subclass_input_gets_the_same_result_type_every_call(general):
    """A torch.Tensor subclass (no __torch_dispatch__) gets the same result type from every call,
    the first (the general path) and the repeated ones (the plan) alike: it once got a plain
    tensor first, then its own class (Tensor.new_empty takes its __torch_function__)."""
    class Marked(torch.Tensor):
        pass
    x, grid, go = _grid_calls(torch.float32, seed=10)
    xs = x.as_subclass(Marked)
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf = xs.contiguous(memory_format=fmt)
        for call in (lambda: AT.grid_sample(xf, grid, align_corners=False),
                     lambda: AT.interpolate(xf, size=(7, 9), mode="bilinear")):
            kinds = [type(call()) for _ in range(3)]
            assert len(set(kinds)) == 1, kinds


def test_wrapper_subclasses_reach_their_own_dispatch():
    """A tensor subclass with its own __torch_dispatch__ (TwoTensor: a wrapper holding two
    tensors, with no memory of its own) goes through the op, so the dispatcher hands it to the
    subclass, which runs our kernels on each inner tensor: forward and backward give F's
    results in both halves (the functions once imported the wrapper's null pointer: a
    segfault)."""
    import torch.nn.functional as F
    two = pytest.importorskip("torch.testing._internal.two_tensor")
    x, grid, _ = _grid_calls(torch.float32, seed=11)
    for call in (lambda m, a, g: m.grid_sample(a, g, align_corners=False),
                 lambda m, a, g: m.interpolate(a, size=(7, 9), mode="bilinear")):
        for _ in range(2):  # the first call of the signature and a repeated one
            X = two.TwoTensor(x.clone(), x.clone()).requires_grad_()
            y = call(AT, X, grid)
            assert type(y) is two.TwoTensor
            y.sum().backward()
            xr = x.clone().requires_grad_()
            want = call(F, xr, grid)
            want.sum().backward()
            for half in (y.a, y.b):
                torch.testing.assert_close(half, want, rtol=0, atol=1e-6)
            for half in (X.grad.a, X.grad.b):
                torch.testing.assert_close(half, xr.grad, rtol=1e-5, atol=1e-5)
