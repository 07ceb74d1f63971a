"""Our vmfb files run in any app with an IREE runtime: here the `iree-run-module` tool of iree-base-runtime.

The exported functions use the coarse-fences ABI, take their outputs as
caller storage (`iree.abi.output`) and a `!hal.buffer` workspace
(`iree.abi.transients`).  What iree-run-module does with that (measured with
iree-base-runtime 3.13):

* it reads the function's `iree.abi.model = "coarse-fences"` reflection and
  appends the wait and signal fences itself;
* an output-storage argument (a tensor, i.e. a buffer view) is an ordinary
  `--input` of the output's shape and type, e.g. `--input=@zeros.npy`;
* the `!hal.buffer` workspace is `--input=&<bytes>xi8`: the `&` prefix makes
  the tool pass a bare !hal.buffer of that size instead of a buffer view
  (`&` on a tensor argument fails with "ref type mismatch ... hal.buffer_view.buffer").
  Its size must be at least the workspace size, which the manifest records as
  `transients_size_constant` when it does not depend on the shapes;
* the `<function>_transients_size` companions carry no reflection, so the tool
  does not add their fences and cannot call them ("input list and function
  mismatch; expected 8 arguments but passed 6"): a host that needs a
  shape-dependent workspace size must call them through the runtime API.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aclnn_iree
from aclnn_iree import aclnn as A
from aclnn_iree.ops import reference as R
from aclnn_iree.compiler import GridSamplerSpec, UpsampleSpec, get_target
from aclnn_iree.compiler.build import ArtifactStore
from aclnn_iree.runtime import kernels, store

REPO = Path(__file__).resolve().parent.parent
TARGET = get_target("llvm-cpu")


def _iree_run_module():
    try:
        import iree._runtime_libs as libs
        p = Path(libs.__file__).parent / "iree-run-module"
        if p.exists():
            return str(p)
    except ImportError:
        pass
    return shutil.which("iree-run-module", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                                  os.environ.get("PATH", "")]))


TOOL = _iree_run_module()
pytestmark = pytest.mark.skipif(TOOL is None, reason="iree-run-module (iree-base-runtime) not found")


def _run(vmfb, function, inputs, outputs, cwd):
    cmd = [TOOL, f"--module={vmfb}", "--device=local-task", f"--function={function}",
           *[f"--input={i}" for i in inputs], *[f"--output=@{o}" for o in outputs]]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout}\n{p.stderr}"
    return [np.load(Path(cwd) / o) for o in outputs]


def _api_result(store_dir, fn):
    """fn() run by the Python API on the artifacts of `store_dir` (global state restored afterwards)."""
    kernels.unload_modules()
    store.set_artifacts_dir(store_dir)
    try:
        return fn()
    finally:
        store.set_artifacts_dir(None)
        kernels.unload_modules()


def _workspace_arg(entry, function):
    size = entry["exports"][function]["transients_size_constant"]
    assert size is not None, "the workspace size depends on the shapes; iree-run-module cannot query it"
    return f"&{max(int(size), 1)}xi8"


@pytest.mark.parametrize("function_suffix", ["", "_points", "_dgrid", "_dgrid_points"])
def test_grid_sampler_runs_in_iree_run_module(tmp_path, monkeypatch, function_suffix):
    from aclnn_iree.compiler import specs
    # phase 1 sizes the workspace of the function it picks: the slot pass for "_dgrid" here
    monkeypatch.setattr(specs, "DGRID_POINTS_MAX_CHANNELS", 10 ** 6 if function_suffix == "_dgrid_points" else 0)
    monkeypatch.setattr(specs, "SPLIT_POINTS_CHANNELS", range(10 ** 6) if function_suffix == "_points" else range(0))
    spec = GridSamplerSpec("bilinear", "border", False, "float32")
    st = ArtifactStore(tmp_path / "artifacts")
    _, entry = st.build_one(spec, TARGET)
    vmfb = st.paths(spec, TARGET)["vmfb"]
    rng = np.random.default_rng(0)
    N, C, H, W, Ho, Wo = 2, 3, 9, 11, 6, 7
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (N, Ho, Wo, 2)).astype(np.float32)
    go = rng.standard_normal((N, C, Ho, Wo)).astype(np.float32)
    for name, a in (("go", go), ("x", x), ("grid", grid), ("dx0", np.zeros_like(x)), ("dg0", np.zeros_like(grid))):
        np.save(tmp_path / f"{name}.npy", a)
    function = spec.kernel_name + function_suffix
    both = function_suffix in ("", "_points")
    storage = ["@dx0.npy", "@dg0.npy"] if both else ["@dg0.npy"]
    outs = ["dx.npy", "dg.npy"] if both else ["dg.npy"]
    mask = (True, True) if both else (False, True)
    if function_suffix == "_dgrid_points":  # no workspace at all
        assert entry["exports"][function]["transients_size_constant"] == "0"
    if entry["exports"][function]["transients_size_constant"] is not None:
        ws_arg = _workspace_arg(entry, function)
    else:  # both gradients: the partial grid-gradient sums depend on the shapes; ask phase 1
        ws = _api_result(st.root, lambda: A.aclnnGridSampler2DBackwardGetWorkspaceSize(
            *(A.aclCreateTensor(a) for a in (go, x, grid)), 0, 1, False, A.aclCreateBoolArray(list(mask)),
            A.aclCreateTensor(x), A.aclCreateTensor(grid))[1])
        assert ws > 0
        ws_arg = f"&{ws}xi8"
    got = _run(vmfb, function, ["@go.npy", "@x.npy", "@grid.npy", *storage, ws_arg], outs, tmp_path)
    dx, dg = _api_result(st.root, lambda: aclnn_iree.grid_sampler_2d_backward(go, x, grid, 0, 1, False, mask))
    ref_dx, ref_dg = R.grid_sampler_2d_backward(go, x, grid, 0, 1, False)
    if both:
        assert got[0].shape == x.shape and got[0].dtype == np.float32
        np.testing.assert_array_equal(got[0], dx)
        np.testing.assert_allclose(got[0], ref_dx, rtol=1e-4, atol=1e-4)
    assert got[-1].shape == grid.shape and got[-1].dtype == np.float32
    np.testing.assert_array_equal(got[-1], dg)
    np.testing.assert_allclose(got[-1], ref_dg, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("function_suffix", ["", "_points", "_dgrid", "_dgrid_points"])
@pytest.mark.parametrize("shape", [(2, 3, 0, 5), (2, 3, 4, 0), (2, 0, 4, 5)], ids=["H0", "W0", "C0"])
def test_grid_sampler_writes_a_zero_grad_grid_for_an_empty_input(tmp_path, function_suffix, shape):
    """An app may call a module with an empty input (C = 0 or H * W = 0; our Python layers
    zero-fill such calls without a kernel): every function still writes grad_grid, all zeros
    (no input value depends on the grid), over the caller's storage, which starts at 7.  The
    fused `_points` pass has no (block, n) pair or band to walk there and writes them apart."""
    spec = GridSamplerSpec("bilinear", "reflection", False, "float32")
    st = ArtifactStore(tmp_path / "artifacts")
    st.build_one(spec, TARGET)
    vmfb = st.paths(spec, TARGET)["vmfb"]
    N, C, H, W = shape
    Ho, Wo = 4, 6
    rng = np.random.default_rng(3)
    arrays = {"go": rng.standard_normal((N, C, Ho, Wo)), "x": np.zeros((N, C, H, W)),
              "grid": rng.uniform(-1.5, 1.5, (N, Ho, Wo, 2)), "dx0": np.zeros((N, C, H, W)),
              "dg0": np.full((N, Ho, Wo, 2), 7.0)}
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", a.astype(np.float32))
    both = function_suffix in ("", "_points")
    storage, outs = (["@dx0.npy", "@dg0.npy"], ["dx.npy", "dg.npy"]) if both else (["@dg0.npy"], ["dg.npy"])
    # a workspace far above any these shapes ask for (test_workspace_bound: at most the
    # largest input's bytes, or IREE's 64-byte minimum)
    got = _run(vmfb, spec.kernel_name + function_suffix, ["@go.npy", "@x.npy", "@grid.npy", *storage, "&65536xi8"],
               outs, tmp_path)
    assert got[-1].shape == (N, Ho, Wo, 2)
    np.testing.assert_array_equal(got[-1], np.zeros((N, Ho, Wo, 2), np.float32))


def test_upsample_runs_in_iree_run_module(tmp_path):
    spec = UpsampleSpec(False, "float32", "NCHW")
    st = ArtifactStore(tmp_path / "artifacts")
    _, entry = st.build_one(spec, TARGET)
    vmfb = st.paths(spec, TARGET)["vmfb"]
    rng = np.random.default_rng(1)
    N, C, H, W, Ho, Wo = 2, 3, 5, 7, 12, 16
    go = rng.standard_normal((N, C, Ho, Wo)).astype(np.float32)
    # The host passes the per-axis scales (area_pixel_compute_scale) as a tensor<2xf32>.
    scales = np.array([R.area_pixel_compute_scale(H, Ho, False), R.area_pixel_compute_scale(W, Wo, False)],
                      np.float32)
    np.save(tmp_path / "go.npy", go)
    np.save(tmp_path / "scales.npy", scales)
    np.save(tmp_path / "dx0.npy", np.zeros((N, C, H, W), np.float32))
    # The upsample workspace (its window tables) depends on the shapes: an embedding app asks
    # the module's `_transients_size` companion through its runtime API, as phase 1 does.
    ws = _api_result(st.root, lambda: A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        A.aclCreateTensor(go, "NCHW"), A.aclCreateIntArray([Ho, Wo]), A.aclCreateIntArray([N, C, H, W]), False,
        0.0, 0.0, A.aclCreateTensor(shape=(N, C, H, W), dtype=np.float32, format="NCHW"))[1])
    assert entry["exports"][spec.kernel_name]["transients_size_constant"] is None and ws > 0
    got, = _run(vmfb, spec.kernel_name, ["@go.npy", "@scales.npy", "@dx0.npy", f"&{ws}xi8"], ["dx.npy"], tmp_path)
    api = _api_result(st.root, lambda: aclnn_iree.upsample_bilinear2d_backward(go, (Ho, Wo), (N, C, H, W), False))
    assert got.shape == (N, C, H, W)
    np.testing.assert_array_equal(got, api)
    np.testing.assert_allclose(got, R.upsample_bilinear2d_backward(go, (Ho, Wo), (N, C, H, W), False),
                               rtol=1e-5, atol=1e-5)
