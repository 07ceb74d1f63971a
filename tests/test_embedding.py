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
  does not add their fences ("input list and function mismatch; expected 8
  arguments but passed 6" when called like their function): they take the
  function's arguments with the workspace and both fences passed as
  `--input='(null)'` (they read the tensors' shapes and the device only) and
  print the size, `result[0]: i64=<bytes>`.

docs/embedding.md gives the manifest's "calls" record (which function a call
takes: compiler/specs.py `calls`, compiler/build.py `calls_record`) and an
`iree-run-module` block per function of the four operators; the tests below
run those blocks as written (ARTIFACTS: the store) and compare with PyTorch.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import aclnn_iree
from aclnn_iree import aclnn as A
from aclnn_iree.ops import reference as R
from aclnn_iree.compiler import GridSamplerSpec, UpsampleSpec, get_target
from aclnn_iree.compiler.specs import GridSampler2dSpec, UpsampleBilinear2dSpec
from aclnn_iree.compiler.build import ArtifactStore
from aclnn_iree.runtime import kernels, store
from test_docs import blocks, commands  # the docs' own reading of fences and console commands

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
    assert size is not None, "the workspace size depends on the shapes: ask the companion (docs/embedding.md)"
    return f"&{max(int(size), 1)}xi8"


# The modules docs/embedding.md runs, and those of the tests above; built once per session.
DOC_SPECS = (GridSamplerSpec("bilinear", "zeros", False, "float32"), UpsampleSpec(False, "float32", "NCHW"),
             GridSampler2dSpec("bilinear", "zeros", False, "float32"),
             UpsampleBilinear2dSpec(False, "float32", "NCHW"))
OTHER_SPECS = (GridSamplerSpec("bilinear", "border", False, "float32"),
               GridSamplerSpec("bilinear", "reflection", False, "float32"))


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """A store holding DOC_SPECS and OTHER_SPECS, built with the project's build API."""
    st = ArtifactStore(tmp_path_factory.mktemp("embedding") / "artifacts")
    res = st.build(DOC_SPECS + OTHER_SPECS, [TARGET], jobs=2, progress=False)
    assert not res.failed, res.failed
    return st


def _entry(st, spec):
    return st.manifest()["artifacts"][st.artifact_id(spec, TARGET)]


@pytest.mark.parametrize("function_suffix", ["", "_points", "_dgrid", "_dgrid_points"])
def test_grid_sampler_runs_in_iree_run_module(tmp_path, monkeypatch, function_suffix, shared_store):
    from aclnn_iree.compiler import specs
    # phase 1 sizes the workspace of the function it picks: the slot pass for "_dgrid" here
    monkeypatch.setattr(specs, "DGRID_POINTS_MAX_CHANNELS", 10 ** 6 if function_suffix == "_dgrid_points" else 0)
    monkeypatch.setattr(specs, "DGRID_POINTS_MAX_ELEMENTS", {})
    monkeypatch.setattr(specs, "SPLIT_POINTS_CHANNELS", range(10 ** 6) if function_suffix == "_points" else range(0))
    spec = GridSamplerSpec("bilinear", "border", False, "float32")
    st = shared_store
    entry = _entry(st, spec)
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
def test_grid_sampler_writes_a_zero_grad_grid_for_an_empty_input(tmp_path, function_suffix, shape, shared_store):
    """An app may call a module with an empty input (C = 0 or H * W = 0; our Python layers
    zero-fill such calls without a kernel): every function still writes grad_grid, all zeros
    (no input value depends on the grid), over the caller's storage, which starts at 7.  The
    fused `_points` pass has no (block, n) pair or band to walk there and writes them apart."""
    spec = GridSamplerSpec("bilinear", "reflection", False, "float32")
    st = shared_store
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


def test_upsample_runs_in_iree_run_module(tmp_path, shared_store):
    spec = UpsampleSpec(False, "float32", "NCHW")
    st = shared_store
    entry = _entry(st, spec)
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


# -- docs/embedding.md: the "calls" record, the rule, and every block run as written ---------

DOC = REPO / "docs" / "embedding.md"
T, F = True, False


def _doc_fences(lang):
    """The code of docs/embedding.md's ```lang blocks, in order (tests/test_docs.blocks)."""
    return [code for fence, code, _, _ in blocks(DOC) if fence == lang]


def _doc_blocks() -> dict:
    """{function: the commands of the console block that calls it} (its one call that is not a companion)."""
    blocks = {}
    for code in _doc_fences("console"):
        cmds = commands(code)
        functions = [re.search(r"--function=(\S+)", c).group(1) for c in cmds]
        calls = [f for f in functions if not f.endswith("_transients_size")]
        assert len(calls) == 1 and calls[0] not in blocks, code
        blocks[calls[0]] = cmds
    return blocks


def _doc_choose():
    """The page's own rule evaluator, `choose` (its one python block, run as written)."""
    code, = _doc_fences("python")
    namespace = {"__name__": "embedding_doc"}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["choose"]


def _run_block(cmds, cwd, artifacts):
    """Runs a block's commands as written in one bash (its WS variable carries over), with the
    documented placeholder ARTIFACTS set to the store and iree-run-module on the PATH."""
    env = dict(os.environ, ARTIFACTS=str(artifacts),
               PATH=os.pathsep.join([str(Path(TOOL).parent), os.environ.get("PATH", "")]))
    script = "set -euo pipefail\n" + "\n".join(cmds) + "\n"
    p = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{script}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def _tol(dtype, ref):
    """float32: 64 ulps relative, and absolute 64 ulps of the output's largest magnitude (sums
    in another order may cancel to near zero)."""
    eps = float(np.finfo(dtype).eps)
    return dict(rtol=64 * eps, atol=64 * eps * max(1.0, float(np.abs(ref).max(initial=0.0))))


def _scales(sizes):
    """The doc's (rh, rw) for align_corners=False and no scales given: 1 where in == out, else in / out, in float32."""
    return np.array([1.0 if i == o else np.float32(i) / np.float32(o) for i, o in sizes], np.float32)


def _doc_case(shared_store, tmp_path, spec, arrays, shapes, mask=None):
    """Chooses the function by the manifest's record (the page's rule), checks it is the
    runtime's, runs the page's block for it on `arrays` (written as .npy beside) and returns
    the outputs the block wrote, by file name."""
    entry = json.loads((Path(shared_store.root) / "manifest.json").read_text())["artifacts"][
        shared_store.artifact_id(spec, TARGET)]
    function, zero_fill = _doc_choose()(entry["calls"], shapes, mask)
    assert function is not None and zero_fill == []
    for name, a in arrays.items():
        np.save(tmp_path / name, a)
    cmds = _doc_blocks()[function]
    _run_block(cmds, tmp_path, shared_store.root)
    outs = re.findall(r"--output=@(\S+)", cmds[-1])
    return function, {o: np.load(tmp_path / o) for o in outs}


GS_CASES = [(C, mask) for C in (4, 8, 12) for mask in ((T, T), (F, T), (T, F))]


@pytest.mark.parametrize("C,mask", GS_CASES, ids=[f"C{c}-{int(m[0])}{int(m[1])}" for c, m in GS_CASES])
def test_doc_grid_sampler_backward(tmp_path, shared_store, C, mask):
    torch = pytest.importorskip("torch")
    spec = DOC_SPECS[0]
    rng = np.random.default_rng(C)
    N, H, W, Ho, Wo = 2, 13, 17, 7, 9
    go = rng.standard_normal((N, C, Ho, Wo)).astype(np.float32)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (N, Ho, Wo, 2)).astype(np.float32)
    arrays = {"grad_output.npy": go, "input.npy": x, "grid.npy": grid,  # storage of any contents
              "grad_input0.npy": np.full(x.shape, 7, np.float32), "grad_grid0.npy": np.full(grid.shape, 7, np.float32)}
    shapes = {"gradOutput": go.shape, "input": x.shape, "grid": grid.shape}
    function, got = _doc_case(shared_store, tmp_path, spec, arrays, shapes, mask)
    assert function == spec.function_name(mask, target=TARGET, channels=C, elements=go.size)  # the runtime's choice
    points = C <= 8 or (spec.interpolation_mode == "bilinear" and go.size <= 262144)
    want_suffix = {(T, T): "_points" if 3 <= C <= 6 else "", (T, F): "_dx",
                   (F, T): "_dgrid_points" if points else "_dgrid"}[mask]
    assert function == spec.kernel_name + want_suffix
    ref = torch.ops.aten.grid_sampler_2d_backward(torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(grid),
                                                  0, 0, False, list(mask))
    expected = {name: r.numpy() for name, r, m in zip(("grad_input.npy", "grad_grid.npy"), ref, mask) if m}
    assert set(got) == set(expected)
    for name, want in expected.items():
        assert got[name].shape == want.shape and got[name].dtype == np.float32
        np.testing.assert_allclose(got[name], want, **_tol(np.float32, want), err_msg=name)


UP_CASES = [(C, same) for C in (3, 12) for same in (False, True)]


@pytest.mark.parametrize("C,same_size", UP_CASES, ids=[f"C{c}-{'same' if s else 'resized'}" for c, s in UP_CASES])
def test_doc_upsample_backward(tmp_path, shared_store, C, same_size):
    torch = pytest.importorskip("torch")
    spec = DOC_SPECS[1]
    rng = np.random.default_rng(C + same_size)
    N, H, W = 2, 5, 7
    Ho, Wo = (H, W) if same_size else (12, 16)
    go = rng.standard_normal((N, C, Ho, Wo)).astype(np.float32)
    arrays = {"grad_out.npy": go, "scales.npy": _scales(((H, Ho), (W, Wo))),
              "grad_input0.npy": np.full((N, C, H, W), 7, np.float32)}
    function, got = _doc_case(shared_store, tmp_path, spec, arrays, {"gradOut": go.shape, "out": (N, C, H, W)})
    assert function == spec.function_name(same_size=same_size) == spec.kernel_name + ("_same_size" if same_size else "")
    want = torch.ops.aten.upsample_bilinear2d_backward(torch.from_numpy(go), [Ho, Wo], [N, C, H, W], False,
                                                       None, None).numpy()
    assert got["grad_input.npy"].shape == want.shape
    np.testing.assert_allclose(got["grad_input.npy"], want, **_tol(np.float32, want))


@pytest.mark.parametrize("C", [3, 12])
def test_doc_grid_sampler_forward(tmp_path, shared_store, C):
    torch = pytest.importorskip("torch")
    spec = DOC_SPECS[2]
    rng = np.random.default_rng(10 + C)
    N, H, W, Ho, Wo = 2, 13, 17, 7, 9
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (N, Ho, Wo, 2)).astype(np.float32)
    arrays = {"input.npy": x, "grid.npy": grid, "output0.npy": np.full((N, C, Ho, Wo), 7, np.float32)}
    function, got = _doc_case(shared_store, tmp_path, spec, arrays, {"input": x.shape, "grid": grid.shape})
    assert function == spec.function_name()
    want = torch.ops.aten.grid_sampler_2d(torch.from_numpy(x), torch.from_numpy(grid), 0, 0, False).numpy()
    assert got["output.npy"].shape == want.shape
    np.testing.assert_allclose(got["output.npy"], want, **_tol(np.float32, want))


UPF_CASES = [(C, sizes) for C in (3, 12) for sizes in ((5, 7, 12, 16), (12, 16, 5, 7), (5, 7, 5, 7))]


@pytest.mark.parametrize("C,sizes", UPF_CASES, ids=[f"C{c}-{s[0]}x{s[1]}to{s[2]}x{s[3]}" for c, s in UPF_CASES])
def test_doc_upsample_forward(tmp_path, shared_store, C, sizes):
    torch = pytest.importorskip("torch")
    spec = DOC_SPECS[3]
    H, W, Ho, Wo = sizes
    N = 2
    x = np.random.default_rng(20 + C).standard_normal((N, C, H, W)).astype(np.float32)
    arrays = {"input.npy": x, "scales.npy": _scales(((H, Ho), (W, Wo))),
              "output0.npy": np.full((N, C, Ho, Wo), 7, np.float32)}
    function, got = _doc_case(shared_store, tmp_path, spec, arrays, {"self": x.shape, "out": (N, C, Ho, Wo)})
    assert function == spec.function_name(same_size=(H, W) == (Ho, Wo))
    want = torch.ops.aten.upsample_bilinear2d(torch.from_numpy(x), [Ho, Wo], False, None, None).numpy()
    assert got["output.npy"].shape == want.shape
    np.testing.assert_allclose(got["output.npy"], want, **_tol(np.float32, want))


def test_doc_blocks_pass_what_the_record_says(shared_store):
    """Each block calls a function the record's rules name, with the record's arguments: the
    companion with all of them (the workspace and both fences null), the call with the tensors
    and a workspace of the companion's size (iree-run-module adds the fences); and every
    function of the four records has its block."""
    blocks = _doc_blocks()
    named = set()
    for spec in DOC_SPECS:
        calls = _entry(shared_store, spec)["calls"]
        assert calls["schema"] == 2
        rule_functions = {r["function"] for r in calls["rules"] if r["function"] is not None}
        assert rule_functions == set(calls["functions"]) <= set(spec.function_names(TARGET))
        named |= rule_functions
        for function in rule_functions:
            size_cmd, call_cmd = blocks[function]
            record = calls["functions"][function]
            assert f'--module="$ARTIFACTS/llvm-cpu/{spec.kernel_name}.vmfb"' in size_cmd and call_cmd
            size_fn = record["workspace"]["size_function"]
            assert re.search(r"--function=(\S+)", size_cmd).group(1) == size_fn["name"] == function + "_transients_size"
            assert size_fn["arguments"] == [a["name"] for a in record["arguments"]]
            size_inputs, call_inputs = (re.findall(r"--input=(\S+)", c) for c in (size_cmd, call_cmd))
            tensors = [a for a in record["arguments"] if "shape" in a]
            assert len(size_inputs) == len(record["arguments"]) and size_inputs[len(tensors):] == ["'(null)'"] * 3
            assert size_fn["null_arguments"] == [a["name"] for a in record["arguments"][len(tensors):]]
            assert call_inputs == size_inputs[:len(tensors)] + ['"&${WS}xi8"']
            assert "sed -n 's/^result\\[0\\]: i64=//p'" in size_cmd and size_cmd.startswith("WS=$(")
            assert len(re.findall(r"--output=@", call_cmd)) == len(record["results"])
            # the record's argument types are the module's own (reflection), in order
            export = _entry(shared_store, spec)["exports"][function]["arguments"]
            assert len(export) == len(record["arguments"])
            for a, t in zip(tensors, export):
                assert t.startswith(f"tensor<{'x'.join(str(d) if isinstance(d, int) else '?' for d in a['shape'])}x")
                assert ("iree.abi.output" in t) == (a["role"] == "output")
            assert export[len(tensors)].startswith("!hal.buffer")
            assert record["arguments"][len(tensors)]["role"] == "workspace"
    assert named == set(blocks)


def test_doc_dgrid_takes_the_companions_workspace_not_zero(tmp_path, shared_store):
    """The issue's report: N=2, C=3 gridGrad only took `_dgrid_points` (workspace 0), and
    `_dgrid` called with that workspace failed.  `_dgrid`'s companion (the page's block) asks
    for a workspace; the block's call with it succeeds (test_doc_grid_sampler_backward) and
    with none fails, as the page says."""
    spec = DOC_SPECS[0]
    rng = np.random.default_rng(5)
    N, C, H, W, Ho, Wo = 2, 3, 13, 17, 7, 9
    for name, shape in {"grad_output.npy": (N, C, Ho, Wo), "input.npy": (N, C, H, W), "grid.npy": (N, Ho, Wo, 2),
                        "grad_grid0.npy": (N, Ho, Wo, 2)}.items():
        np.save(tmp_path / name, rng.uniform(-1, 1, shape).astype(np.float32))
    size_cmd, call_cmd = _doc_blocks()[spec.kernel_name + "_dgrid"]
    out = _run_block([size_cmd, 'echo "WS=$WS"'], tmp_path, shared_store.root)
    assert int(re.search(r"^WS=(\d+)$", out, re.M).group(1)) > 0
    functions = _entry(shared_store, spec)["calls"]["functions"]
    assert functions[spec.kernel_name + "_dgrid"]["workspace"]["bytes"] is None
    assert functions[spec.kernel_name + "_dgrid_points"]["workspace"]["bytes"] == 0
    env = dict(os.environ, ARTIFACTS=shared_store.root, PATH=os.pathsep.join([str(Path(TOOL).parent),
                                                                              os.environ.get("PATH", "")]))
    p = subprocess.run(["bash", "-c", call_cmd.replace('"&${WS}xi8"', '"&0xi8"')], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "OUT_OF_RANGE" in p.stderr


def _shim(shape, device=None):
    """What bind() reads of a tensor: shape, size, dtype (and device, for the upsample scales)."""
    return types.SimpleNamespace(shape=tuple(shape), size=int(np.prod(shape)), dtype=np.dtype(np.float32),
                                 device=device)


def _check_binding(binding, calls, chosen, names):
    """bind()'s Binding is what the rule chose: the function (with the record's argument order)
    or no call, and the same outputs zero-filled."""
    function, zero_fill = chosen
    assert binding.function == (function or ""), (binding, chosen)
    assert (binding.spec is None) == (function is None)
    assert [names[id(t)] for t in binding.zero_fill] == zero_fill
    if function is not None:
        args = [a["name"] for a in calls["functions"][function]["arguments"] if "shape" in a]
        assert [names.get(id(t), "scales") for t in binding.tensors] == args


@pytest.mark.parametrize("target_name", ["llvm-cpu", "cuda"])
def test_calls_rules_are_the_runtimes_choice(target_name, monkeypatch):
    """The record's rules, evaluated by the page's `choose`, pick what the runtime's phase 1
    (each operator's bind) picks: every mask, channel counts 0-18, empty shapes, the
    deterministic option, every interpolation mode, CPU and GPU modules; the point pass's
    element bound lowered to 300 so that these shapes fall on both sides of it and on it."""
    from aclnn_iree.compiler import specs
    from aclnn_iree.ops import grid_sampler as gs, grid_sampler_forward as gsf, upsample as up
    from aclnn_iree.ops import upsample_forward as upf
    choose, target = _doc_choose(), get_target(target_name)  # (its block's examples: the real bound)
    monkeypatch.setattr(specs, "DGRID_POINTS_MAX_ELEMENTS", {"bilinear": 300})  # 2 x 10 x 3 x 5: on it
    for code, mode in enumerate(("bilinear", "nearest", "bicubic")):
        spec = GridSamplerSpec(mode, "zeros", False, "float32")
        calls = spec.calls(target)
        for N, C, Ho, Wo in itertools.product((0, 2), range(19), (0, 3), (0, 5)):
            t = dict(gradOutput=_shim((N, C, Ho, Wo)), input=_shim((N, C, 4, 6)), grid=_shim((N, Ho, Wo, 2)),
                     inputGrad=_shim((N, C, 4, 6)), gridGrad=_shim((N, Ho, Wo, 2)))
            names = {id(v): k for k, v in t.items()}
            shapes = {k: v.shape for k, v in t.items()}
            for mask in itertools.product((F, T), repeat=2):
                for det in (F, T):
                    b = gs.bind(t["gradOutput"], t["input"], t["grid"], code, 0, False, mask, t["inputGrad"],
                                t["gridGrad"], target, det)
                    _check_binding(b, calls, choose(calls, shapes, mask, det), names)
        fspec = GridSampler2dSpec(mode, "zeros", False, "float32")
        fcalls = fspec.calls(target)
        for N, C, Ho, Wo in itertools.product((0, 2), (0, 3), (0, 3), (0, 5)):
            t = dict(input=_shim((N, C, 4, 6)), grid=_shim((N, Ho, Wo, 2)), out=_shim((N, C, Ho, Wo)))
            b = gsf.bind(t["input"], t["grid"], code, 0, False, t["out"])
            _check_binding(b, fcalls, choose(fcalls, {k: v.shape for k, v in t.items()}),
                           {id(v): k for k, v in t.items()})
    device = A.aclCreateTensor(shape=(1,), dtype=np.float32).device
    for layout in ("NCHW", "NHWC"):
        bspec, fspec = UpsampleSpec(False, "float32", layout), UpsampleBilinear2dSpec(False, "float32", layout)
        bcalls, fcalls = bspec.calls(target), fspec.calls(target)

        def shape(n, c, h, w):
            return (n, h, w, c) if layout == "NHWC" else (n, c, h, w)

        for N, C, H, W, Ho, Wo in itertools.product((0, 2), (0, 3), (4, 7), (5, 9), (4, 7), (5, 9)):
            t = dict(gradOut=_shim(shape(N, C, Ho, Wo), device), out=_shim(shape(N, C, H, W), device))
            b = up.bind(t["gradOut"], False, t["out"], layout, (1.0, 1.0))
            _check_binding(b, bcalls, choose(bcalls, {k: v.shape for k, v in t.items()}),
                           {id(v): k for k, v in t.items()})
            t = dict(self=_shim(shape(N, C, H, W), device), out=_shim(shape(N, C, Ho, Wo), device))
            b = upf.bind(t["self"], False, t["out"], layout, (1.0, 1.0), target)
            _check_binding(b, fcalls, choose(fcalls, {k: v.shape for k, v in t.items()}),
                           {id(v): k for k, v in t.items()})


def test_build_adds_missing_calls_records(shared_store, tmp_path):
    """A store built before the record existed gets it from the next build, which compiles nothing."""
    copy = tmp_path / "artifacts"
    shutil.copytree(shared_store.root, copy, ignore=shutil.ignore_patterns("*.lock"))
    path = copy / "manifest.json"
    m = json.loads(path.read_text())
    for entry in m["artifacts"].values():
        del entry["calls"]
    path.write_text(json.dumps(m))
    st = ArtifactStore(copy)
    res = st.build(DOC_SPECS, [TARGET], jobs=1, progress=False)
    assert res.compiled == 0 and res.reused == len(DOC_SPECS) and not res.failed
    for spec in DOC_SPECS:
        assert _entry(st, spec)["calls"] == _entry(shared_store, spec)["calls"]
    for spec in OTHER_SPECS:  # not built this time: left as they were
        assert "calls" not in _entry(st, spec)
    mtime = path.stat().st_mtime_ns
    assert st.build(DOC_SPECS, [TARGET], jobs=1, progress=False).compiled == 0
    assert path.stat().st_mtime_ns == mtime  # nothing to add: the manifest is not rewritten


@pytest.mark.parametrize("damage", ["constant_text", "constant_inf", "constant_huge", "export_str", "size_fn_list"])
def test_build_keeps_a_module_whose_exports_are_damaged(shared_store, tmp_path, damage):
    """A manifest entry whose "exports" were damaged (by hand or by a bad copy) while its key
    and sha256 still match: the next build warns naming the entry and finishes (it raised a
    traceback), the module still counts as built and its old record stays."""
    copy = tmp_path / "artifacts"
    shutil.copytree(shared_store.root, copy, ignore=shutil.ignore_patterns("*.lock"))
    path = copy / "manifest.json"
    m = json.loads(path.read_text())
    spec = DOC_SPECS[0]
    aid = ArtifactStore(copy).artifact_id(spec, TARGET)
    exports = m["artifacts"][aid]["exports"]
    name = sorted(exports)[0]
    if damage == "export_str":
        exports[name] = "not an export"
    elif damage == "size_fn_list":
        exports[name]["transients_size_function"] = ["x"]
    else:
        exports[name]["transients_size_constant"] = {"constant_text": "abc", "constant_inf": float("inf"),
                                                     "constant_huge": "9" * 40}[damage]
    del m["artifacts"][aid]["calls"]
    path.write_text(json.dumps(m))
    with pytest.warns(RuntimeWarning, match=f"{aid} has malformed \"exports\""):
        res = ArtifactStore(copy).build([spec], [TARGET], jobs=1, progress=False)
    assert res.compiled == 0 and res.reused == 1 and not res.failed
