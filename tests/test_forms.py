"""Kernel forms (tuned / linalg) and the targets only IREE's own code generation reaches.

* Choosing the form: the Pythonic `form=`, the aclnn layer's ACLNN_IREE_OPT_FORM option and
  ACLNN_IREE_FORM variable, with their errors; a form an operator lacks is a status, not a
  crash.  (The numerical suites of the operators with a linalg form run on both forms:
  conftest.kernel_form.)
* rocm, metal-spirv and vmvx: a sample of specialisations that covers every mode, padding,
  align_corners and dtype value of each operator compiles for each target (the form
  buildable_pairs gives it); vmvx also runs a sample of every mode, padding and
  align_corners of each operator, against PyTorch.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from aclnn_iree.compiler.build import ArtifactStore, buildable_pairs
from aclnn_iree.compiler.specs import FORMS, all_specs
from aclnn_iree.compiler.targets import TARGETS, get_target
from aclnn_iree.core import aclnn as A
from aclnn_iree.core import api
from aclnn_iree.core.errors import ACLNN_ERR_INNER_FIND_KERNEL_ERROR, ACLNN_ERR_PARAM_INVALID, AclnnError

torch = pytest.importorskip("torch")


def _sample(op: str) -> list:
    """Specialisations of `op` such that every value of every parameter (and dtype) appears:
    the i-th takes the i-th value of each parameter, cycling."""
    specs = list(all_specs([op]))
    fields = [f for f in specs[0].__dataclass_fields__ if f != "form"]
    values = {f: sorted({getattr(s, f) for s in specs}, key=str) for f in fields}
    n = max(len(v) for v in values.values())
    want = [{f: values[f][i % len(values[f])] for f in fields} for i in range(n)]
    return [next(s for s in specs if all(getattr(s, f) == w[f] for f in fields)) for w in want]


SAMPLE = [s for op in ("grid_sampler_2d_backward", "upsample_bilinear2d_backward", "grid_sampler_2d",
                       "upsample_bilinear2d") for s in _sample(op)]


@pytest.mark.parametrize("target", ["rocm", "metal-spirv", "vmvx"])
def test_sample_compiles_for_the_targets_without_a_test_machine(target, tmp_path):
    t = TARGETS[target]
    pairs = buildable_pairs(SAMPLE, [t])
    forms = {s.form for s, _ in pairs}
    assert forms == ({"linalg"} if target == "vmvx" else {"tuned"})  # the hand GPU forms compile for rocm and metal
    assert {s.dtype for s, _ in pairs} == set(t.dtypes)
    res = ArtifactStore(str(tmp_path)).build(SAMPLE, [t], progress=False)
    assert res.failed == [] and res.compiled == len(pairs)
    entries = ArtifactStore(str(tmp_path)).manifest()["artifacts"].values()
    assert {(e["specialisation"]["form"], e["target"]) for e in entries} == {(f, target) for f in forms}


# vmvx's sample: each mode, padding and align_corners value once per grid sampler (each module
# compiles on first use, about 1.2 s; every mode's module compiles in the sample test above too)
VMVX_GRID = ((0, 0, False), (1, 1, True), (2, 2, False), (0, 2, True), (2, 1, True))


def test_vmvx_computes_what_pytorch_does():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6, 7)).astype(np.float32)
    grid = (rng.random((2, 4, 5, 2)) * 2.4 - 1.2).astype(np.float32)
    tx, tg = torch.from_numpy(x), torch.from_numpy(grid)
    eps = np.finfo(np.float32).eps
    for mode, pad, ac in VMVX_GRID:
        want = torch.grid_sampler_2d(tx, tg, mode, pad, ac).numpy()
        got = api.grid_sampler_2d(x, grid, mode, pad, ac, device="vmvx")
        np.testing.assert_allclose(got, want, rtol=0, atol=64 * eps * np.abs(x).max(), err_msg=str((mode, pad, ac)))
    go = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for mode, pad, ac in VMVX_GRID:
        want = torch.ops.aten.grid_sampler_2d_backward(torch.from_numpy(go), tx, tg, mode, pad, ac, [True, True])
        got = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, device="vmvx")
        scale = np.abs(go).sum() * max(np.abs(x).max(), 1)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w.numpy(), rtol=0, atol=256 * eps * scale, err_msg=str((mode, pad, ac)))
    for ac, size in zip((False, True, False), ((11, 4), (3, 9), (6, 7))):
        want = torch.nn.functional.interpolate(tx, size=size, mode="bilinear", align_corners=ac).numpy()
        got = api.upsample_bilinear2d(x, size, ac, device="vmvx")
        np.testing.assert_allclose(got, want, rtol=0, atol=16 * eps * np.abs(x).max())
        go = rng.standard_normal((2, 3, *size)).astype(np.float32)
        want = torch.ops.aten.upsample_bilinear2d_backward(torch.from_numpy(go), list(size), [2, 3, 6, 7], ac).numpy()
        got = api.upsample_bilinear2d_backward(go, size, (2, 3, 6, 7), ac, device="vmvx")
        np.testing.assert_allclose(got, want, rtol=0, atol=64 * eps * np.abs(go).sum(axis=(2, 3)).max())


def test_vmvx_refuses_the_dtypes_it_cannot_compute():
    x = np.ones((1, 1, 4, 4), np.float16)
    with pytest.raises(AclnnError) as e:
        api.upsample_bilinear2d(x, (8, 8), device="vmvx")
    assert e.value.status == ACLNN_ERR_PARAM_INVALID and "vmvx" in str(e.value) and "float16" in str(e.value)


def test_form_argument_and_its_errors():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    a = api.upsample_bilinear2d(x, (7, 5), form="tuned")
    b = api.upsample_bilinear2d(x, (7, 5), form="linalg")
    assert np.array_equal(a, b)  # both compute PyTorch's float expressions on CPUs
    for bad in ("fast", 1, "LINALG"):
        with pytest.raises(AclnnError) as e:
            api.upsample_bilinear2d(x, (7, 5), form=bad)
        assert e.value.status == ACLNN_ERR_PARAM_INVALID and "form" in str(e.value)


def test_a_form_an_operator_lacks_is_a_status(monkeypatch):
    from aclnn_iree.ops.registry import get
    spec_cls = get("grid_sampler_2d_backward").spec
    monkeypatch.setattr(spec_cls, "forms", ("tuned",))  # an operator whose linalg form is not written
    go, x, grid = np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32)
    with pytest.raises(AclnnError) as e:
        api.grid_sampler_2d_backward(go, x, grid, form="linalg", device="local-sync")
    assert e.value.status == ACLNN_ERR_INNER_FIND_KERNEL_ERROR and "no linalg form" in str(e.value)


def test_environment_and_context_option(monkeypatch):
    monkeypatch.delenv(A.FORM_ENV, raising=False)
    assert A.current_form() == "tuned"
    monkeypatch.setenv(A.FORM_ENV, "linalg")
    assert A.current_form() == "linalg"
    assert A.aclrtCtxGetSysParamOpt(A.ACLNN_IREE_OPT_FORM) == (A.ACLNN_SUCCESS, 1)
    status, ctx = A.aclrtCreateContext()
    try:
        assert A.aclrtCtxSetSysParamOpt(A.ACLNN_IREE_OPT_FORM, 0) == A.ACLNN_SUCCESS
        assert A.current_form() == "tuned"  # the context's option wins over the variable
        assert A.aclrtCtxSetSysParamOpt(A.ACLNN_IREE_OPT_FORM, 2) == ACLNN_ERR_PARAM_INVALID
    finally:
        A.aclrtDestroyContext(ctx)
    monkeypatch.setenv(A.FORM_ENV, "fastest")
    with pytest.raises(AclnnError) as e:
        A.current_form()
    assert e.value.status == ACLNN_ERR_PARAM_INVALID and A.FORM_ENV in str(e.value)
    x = A.aclCreateTensor(np.ones((1, 1, 2, 2), np.float32), "NCHW")
    out = A.aclCreateTensor(shape=(1, 1, 4, 4), dtype=np.float32, format="NCHW")
    status, _, ex = A.aclnnUpsampleBilinear2dGetWorkspaceSize(x, A.aclCreateIntArray([4, 4]), False, -1.0, -1.0, out)
    assert status == ACLNN_ERR_PARAM_INVALID and ex is None and A.FORM_ENV in A.aclGetRecentErrMsg()


def test_call_options_read_the_variable_as_it_is_now(monkeypatch):
    """call_options (what keys the layers' repeated calls) reads ACLNN_IREE_FORM through
    os.environ's own dict: every way of changing os.environ is seen at the next call, and an
    object put in os.environ's place is asked as a mapping."""
    import os
    monkeypatch.setenv(A.FORM_ENV, " linalg ")  # stripped, as phase 1 reads it
    assert A.call_options() == (False, "linalg")
    os.environ.pop(A.FORM_ENV)
    assert A.call_options() == (False, "tuned")
    os.environ.update({A.FORM_ENV: "linalg"})
    assert A.current_form() == "linalg"
    with A.scoped_determinism(True), A.scoped_form("tuned"):  # the context's options win
        assert A.call_options() == (True, "tuned")
    os.environ[A.FORM_ENV] = ""
    assert A.call_options() == (False, "tuned")
    monkeypatch.setattr(os.environ, "_data", dict(os.environ._data))  # a new dict behind os.environ
    os.environ[A.FORM_ENV] = "linalg"
    assert A.call_options() == (False, "linalg")
    os.environ[A.FORM_ENV] = "tuned"
    assert A.call_options() == (False, "tuned")
    monkeypatch.setattr(os, "environ", {A.FORM_ENV: "linalg"})
    assert A.call_options() == (False, "linalg")
    os.environ[A.FORM_ENV] = "fastest"
    with pytest.raises(AclnnError) as e:
        A.call_options()
    assert e.value.status == ACLNN_ERR_PARAM_INVALID and "'fastest'" in str(e.value)


def test_a_context_destroyed_by_another_thread_is_no_longer_current(monkeypatch):
    """docs/aclnn.md: the threads a destroyed context was current on fall back to the default
    context, whichever thread destroyed it (seen: only the destroying thread's own current
    context was reset, and another thread kept using the destroyed one's options)."""
    import threading
    monkeypatch.delenv(A.FORM_ENV, raising=False)
    made, destroyed, seen = threading.Event(), threading.Event(), {}

    def worker():
        status, ctx = A.aclrtCreateContext()
        seen["ctx"] = ctx
        assert A.aclrtCtxSetSysParamOpt(A.ACLNN_IREE_OPT_FORM, 1) == A.ACLNN_SUCCESS
        seen["before"] = A.current_form()
        made.set()
        destroyed.wait(10)
        seen["current"] = A.aclrtGetCurrentContext()[1]
        seen["after"] = A.current_form()
    t = threading.Thread(target=worker)
    t.start()
    made.wait(10)
    assert A.aclrtDestroyContext(seen["ctx"]) == A.ACLNN_SUCCESS
    destroyed.set()
    t.join(10)
    assert seen["before"] == "linalg" and seen["after"] == "tuned"
    assert seen["current"] is not seen["ctx"] and not seen["current"].destroyed
    # option ids are ints, as aclnn's enum: 1000.0 is not ACLNN_IREE_OPT_FORM
    assert A.aclrtCtxGetSysParamOpt(float(A.ACLNN_IREE_OPT_FORM))[0] == ACLNN_ERR_PARAM_INVALID
    assert A.aclrtCtxSetSysParamOpt(float(A.ACLNN_IREE_OPT_FORM), 1) == ACLNN_ERR_PARAM_INVALID


def test_what_each_target_builds_of_each_spec():
    vmvx, cpu = get_target("vmvx"), get_target("llvm-cpu")
    for spec in all_specs(forms=FORMS):
        assert spec.kernel_name.endswith("_linalg") == spec.linalg
        assert spec.template == f"{spec.op}/{'linalg' if spec.linalg else 'module'}.mlir.j2"
        assert spec.for_target(cpu) == spec
        built = spec.for_target(vmvx)
        if spec.dtype != "float32":
            assert built is None
        else:
            assert built.linalg and built.kernel_name.removesuffix("_linalg") == spec.kernel_name.removesuffix("_linalg")


def test_lavapipe_refuses_a_serial_scatter_past_its_loop_budget():
    """The linalg grid-sampler backward scatters serially (IREE has no parallel scatter-add of
    colliding indices); Mesa's lavapipe stops an invocation after 65535 loop iterations, so a
    call past the budget is refused (561002), never truncated, and one within it is right."""
    from aclnn_iree.core.errors import ACLNN_ERR_INNER_TILING_ERROR
    from aclnn_iree.runtime.device import DeviceUnavailable, get_device
    try:
        dev = get_device("vulkan")
    except DeviceUnavailable:
        pytest.skip("no Vulkan device")
    if dev.loop_budget is None:
        pytest.skip("the Vulkan device is not lavapipe: no loop budget")
    rng = np.random.default_rng(2)
    for (N, C, Ho, Wo), refused in (((1, 2, 40, 40), False), ((2, 8, 64, 64), True)):
        x = rng.standard_normal((N, C, 9, 11)).astype(np.float32)
        grid = (rng.random((N, Ho, Wo, 2)) * 2.2 - 1.1).astype(np.float32)
        go = rng.standard_normal((N, C, Ho, Wo)).astype(np.float32)
        if refused:
            with pytest.raises(AclnnError) as e:
                api.grid_sampler_2d_backward(go, x, grid, form="linalg", device="vulkan")
            assert e.value.status == ACLNN_ERR_INNER_TILING_ERROR and "lavapipe" in str(e.value)
            continue
        dx, dg = api.grid_sampler_2d_backward(go, x, grid, form="linalg", device="vulkan")
        want = torch.ops.aten.grid_sampler_2d_backward(*(torch.from_numpy(a.astype(np.float64)) for a in (go, x, grid)),
                                                       0, 0, False, [True, True])
        np.testing.assert_allclose(dx, want[0].numpy(), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(dg, want[1].numpy(), rtol=1e-5, atol=1e-3)


def test_torch_layer_follows_the_form_in_effect(monkeypatch):
    """The torch layer's repeated-call plans are kept per form: switching ACLNN_IREE_FORM in
    a process switches the kernels of later calls; both compute PyTorch's gradients."""
    import torch.nn.functional as F
    import aclnn_iree.torch as AT
    from aclnn_iree.runtime import kernels
    from conftest import no_loaded_modules
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 7, generator=g, requires_grad=True)
    grid = (torch.rand(2, 4, 5, 2, generator=g) * 2.2 - 1.1).requires_grad_()

    def step(fn):
        x.grad = grid.grad = None
        y = fn.interpolate(x, size=(9, 5), mode="bilinear", align_corners=False)
        fn.grid_sample(y, grid, mode="bicubic", padding_mode="reflection", align_corners=True).square().sum().backward()
        return [t.detach().clone() for t in (x.grad, grid.grad)]
    want = step(F)
    no_loaded_modules(monkeypatch)  # the modules each step loads, from none (plans made anew)
    for form in ("tuned", "linalg"):
        monkeypatch.setenv(A.FORM_ENV, form)
        before = set(kernels._modules)
        got = step(AT)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        new = {spec for (_, spec) in set(kernels._modules) - before}
        assert new and {spec.form for spec in new} == {form}, new
