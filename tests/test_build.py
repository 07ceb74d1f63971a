"""The ahead-of-time build: artifact store, manifest, rebuild rules, offline mode, the CLI, the wheel."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import aclnn_iree
import aclnn_iree.compiler.build as build_mod
from aclnn_iree import cli
from aclnn_iree.compiler import GridSamplerSpec, UpsampleSpec, get_target
from aclnn_iree.compiler.build import ArtifactStore
from aclnn_iree.compiler.key import artifact_key
from aclnn_iree.compiler.specs import all_specs
from aclnn_iree.core.errors import ACLNN_ERR_INNER_FIND_KERNEL_ERROR, AclnnError
from aclnn_iree.runtime import store
from conftest import no_loaded_modules

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "templates"

TARGET = get_target("llvm-cpu")
GRID_SPECS = [GridSamplerSpec("bilinear", "zeros", False, "float32"),
              GridSamplerSpec("bilinear", "border", False, "float32")]
UPSAMPLE_SPECS = [UpsampleSpec(False, "float32", "NCHW")]
SPECS = GRID_SPECS + UPSAMPLE_SPECS

REQUIRED_FIELDS = ("op", "kernel_name", "specialisation", "template", "template_files", "template_sha256", "functions", "exports",
                   "target", "target_arch", "target_cpu", "driver", "flags", "command", "compiler_version",
                   "compiler_build", "key", "source_sha256", "vmfb_sha256", "vmfb_bytes", "files")


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class CountingCompile:
    """A wrapper of compile_file that counts the compiler invocations (by kernel name)."""

    def __init__(self):
        self.real = build_mod.compile_file
        self.names = []

    def __call__(self, path, flags):
        self.names.append(Path(path).stem)
        return self.real(path, flags)


@pytest.fixture
def counter(monkeypatch):
    c = CountingCompile()
    monkeypatch.setattr(build_mod, "compile_file", c)
    return c


@pytest.fixture(scope="module")
def built_store(tmp_path_factory):
    """The subset, built once (each test that changes it works on a copy)."""
    root = tmp_path_factory.mktemp("store")
    res = ArtifactStore(root).build(SPECS, [TARGET], jobs=2, progress=False)
    assert not res.failed, res.failed
    assert res.compiled == len(SPECS)
    return root


@pytest.fixture
def store_copy(built_store, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(built_store, dst)
    return ArtifactStore(dst)


def test_manifest_has_every_field(built_store):
    st = ArtifactStore(built_store)
    arts = st.manifest()["artifacts"]
    assert set(arts) == {f"llvm-cpu/{s.kernel_name}" for s in SPECS}
    for s in SPECS:
        e = arts[f"llvm-cpu/{s.kernel_name}"]
        missing = [f for f in REQUIRED_FIELDS if f not in e]
        assert not missing, f"{s.kernel_name}: manifest lacks {missing}"
        p = st.paths(s, TARGET)
        assert e["op"] == s.op and e["kernel_name"] == s.kernel_name
        assert e["specialisation"] == dataclasses.asdict(s)
        assert e["target"] == "llvm-cpu" and e["target_arch"] == e["target_cpu"] == "host"
        assert e["host_cpu"]["machine"] and isinstance(e["host_cpu"]["features"], list)
        assert e["flags"] == list(TARGET.flags) and "--iree-llvmcpu-target-cpu=host" in e["flags"]
        # compiled in place from the store's own .mlir, the module on stdout: the command ran there
        assert e["command"][-3:] == [Path(p["mlir"]).name, "-o", "-"]
        assert e["command_cwd"] == str(Path(p["mlir"]).parent)
        assert Path(p["cmd"]).read_text().strip().endswith(f"> {Path(p['vmfb']).name}")
        assert e["compiler_version"] == build_mod.compiler_version()
        assert "IREE compiler version" in e["compiler_build"]
        assert e["source_sha256"] == _sha(p["mlir"])
        assert e["vmfb_sha256"] == _sha(p["vmfb"]) and e["vmfb_bytes"] == os.path.getsize(p["vmfb"])
        assert e["template"] == s.template
        # every file it was rendered from (root and partials), each with the sha256 of its text on disk
        assert s.template in e["template_files"] and "_common.mlir.j2" in e["template_files"]
        assert e["template_files"] == {n: _sha(TEMPLATES / n) for n in e["template_files"]}
        if s.op == "grid_sampler_2d_backward":
            assert len(e["template_files"]) > 2  # its partials too
        assert e["key"] == artifact_key(s, TARGET)
        # every exported function, with its argument and result signature
        expected = set(s.function_names()) | {n + "_transients_size" for n in s.function_names()}
        assert set(e["functions"]) == expected == set(e["exports"])
        for name in s.function_names():
            x = e["exports"][name]
            assert x["abi_model"] == "coarse-fences"
            assert e["functions"][name].startswith(f"async func @{name}(")
            types = [a.split(" ")[0] for a in x["arguments"]]
            assert types[-3:] == ["!hal.buffer", "!hal.fence", "!hal.fence"]
            assert "iree.abi.transients" in x["arguments"][-3]
            assert any("iree.abi.output = 0" in a for a in x["arguments"])
            assert x["results"] and all(r.startswith("tensor<") for r in x["results"])
            assert x["transients_size_function"] == name + "_transients_size"
            # The grid sampler accumulates dx in slots of H*W pixels x min(C, 8) channels, keeps the
            # channel blocks' partial grid-gradient sums, and the upsample its window tables:
            # these grow with the shapes (None).  Nearest's grad_grid alone (zeros), the
            # point-parallel grad_grid pass and the upsample's same-size pass (elementwise) need
            # no scratch ("0").
            no_scratch = (isinstance(s, GridSamplerSpec) and (
                (s.interpolation_mode == "nearest" and name.endswith("_dgrid")) or name.endswith("_dgrid_points"))
                or name.endswith("_same_size"))
            shape_dependent = not no_scratch
            assert (x["transients_size_constant"] is None) == shape_dependent, name
            size = e["exports"][name + "_transients_size"]
            assert size == {"companion_of": name, "arguments": x["arguments"], "results": ["i64"]}
            assert e["functions"][name + "_transients_size"].endswith(f"-> i64  (workspace bytes of @{name})")
        x = e["exports"][s.kernel_name]
        if isinstance(s, GridSamplerSpec):
            assert x["arguments"][:3] == ["tensor<?x?x?x?xf32>", "tensor<?x?x?x?xf32>", "tensor<?x?x?x2xf32>"]
            assert x["results"] == ["tensor<?x?x?x?xf32>", "tensor<?x?x?x2xf32>"]
        else:
            assert x["arguments"][:3] == ["tensor<?x?x?x?xf32>", "tensor<2xf32>",
                                          "tensor<?x?x?x?xf32> {iree.abi.output = 0 : index}"]
            assert x["results"] == ["tensor<?x?x?x?xf32>"]


def test_second_build_compiles_nothing(store_copy, counter):
    res = store_copy.build(SPECS, [TARGET], jobs=2, progress=False)
    assert (res.compiled, res.reused, res.failed) == (0, len(SPECS), [])
    assert counter.names == []
    assert all(store_copy.status(s, TARGET) == "ok" for s in SPECS)


def test_changed_template_rebuilds_only_what_it_feeds(store_copy, counter, monkeypatch):
    """The key is the rendered MLIR's sha256: a change to what one family renders (its template
    or a partial only it imports) rebuilds that family and nothing else."""
    real = build_mod.render

    def changed(spec, target=None):
        text = real(spec, target)
        return text + "\n// edited\n" if spec.op == GridSamplerSpec.op else text

    monkeypatch.setattr(build_mod, "render", changed)
    assert all(store_copy.status(s, TARGET) == "stale" for s in GRID_SPECS)
    assert all(store_copy.status(s, TARGET) == "ok" for s in UPSAMPLE_SPECS)
    with pytest.warns(RuntimeWarning, match="stale"):
        res = store_copy.build(SPECS, [TARGET], jobs=2, progress=False)
    assert (res.compiled, res.reused, res.failed) == (len(GRID_SPECS), len(UPSAMPLE_SPECS), [])
    assert sorted(counter.names) == sorted(s.kernel_name for s in GRID_SPECS)
    # ... and once rebuilt, they are valid under the new template
    res = store_copy.build(SPECS, [TARGET], jobs=2, progress=False)
    assert res.compiled == 0 and len(counter.names) == len(GRID_SPECS)


def test_corrupt_vmfb_is_detected_and_rebuilt(store_copy, counter):
    spec = GRID_SPECS[0]
    path = store_copy.paths(spec, TARGET)["vmfb"]
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2: len(data) // 2 + 16] = b"\xde\xad\xbe\xef" * 4
    Path(path).write_bytes(bytes(data))
    assert store_copy.status(spec, TARGET) == "corrupt"
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert store_copy.lookup(spec, TARGET) is None
    with pytest.warns(RuntimeWarning, match="corrupt"):
        res = store_copy.build(SPECS, [TARGET], jobs=2, progress=False)
    assert (res.compiled, res.reused) == (1, len(SPECS) - 1)
    assert counter.names == [spec.kernel_name]
    assert store_copy.lookup(spec, TARGET) is not None
    assert _sha(path) == store_copy.manifest()["artifacts"][f"llvm-cpu/{spec.kernel_name}"]["vmfb_sha256"]


def test_failed_compile_is_reported_and_the_others_go_on(tmp_path, monkeypatch, counter):
    broken = GRID_SPECS[1]
    real = build_mod.render
    monkeypatch.setattr(build_mod, "render",
                        lambda s, t=None: "util.func public @oops( {\n" if s == broken else real(s, t))
    st = ArtifactStore(tmp_path / "store")
    res = st.build(GRID_SPECS, [TARGET], jobs=2, progress=False)
    assert res.compiled == 1 and len(res.failed) == 1
    kernel, target, message = res.failed[0]
    assert (kernel, target) == (broken.kernel_name, "llvm-cpu")
    assert "command:" in message and "iree-compile" in message and "error" in message
    assert st.status(GRID_SPECS[0], TARGET) == "ok" and st.status(broken, TARGET) == "missing"
    assert f"llvm-cpu/{broken.kernel_name}" not in st.manifest()["artifacts"]


def test_template_that_does_not_render_is_reported(tmp_path, monkeypatch):
    """Not only compiler errors: a missing or broken template fails its specialisations, the others go on."""
    import jinja2
    real = build_mod.render

    def render(s, t=None):
        if s == GRID_SPECS[1]:
            raise jinja2.TemplateNotFound(s.template)
        return real(s, t)

    monkeypatch.setattr(build_mod, "render", render)
    res = ArtifactStore(tmp_path).build(GRID_SPECS, [TARGET], jobs=2, progress=False)
    assert res.compiled == 1
    assert res.failed == [(GRID_SPECS[1].kernel_name, "llvm-cpu", f"TemplateNotFound: {GRID_SPECS[1].template}")]


def test_cli_build_exit_status_on_failure(tmp_path, monkeypatch, capsys):
    broken = GRID_SPECS[1]
    real = build_mod.render
    monkeypatch.setattr(build_mod, "render", lambda s, t=None: "not mlir at all\n" if s == broken else real(s, t))
    rc = cli.main(["build", "--op", "grid_sampler_2d_backward", "--dtype", "float32", "--kernel", "*bilinear_*_ac0*",
                   "--out", str(tmp_path), "--jobs", "2", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert f"FAILED llvm-cpu/{broken.kernel_name}" in err
    assert "specialisation: GridSamplerSpec(interpolation_mode='bilinear', padding_mode='border'" in err
    assert "command:" in err and "iree-compile" in err
    assert "summary: compiled 2, reused 0, failed 1 of 3" in out


def test_offline_mode_raises_artifact_missing(tmp_path, monkeypatch):
    empty, cache = tmp_path / "empty", tmp_path / "cache"
    empty.mkdir()
    cache.mkdir()
    monkeypatch.setenv("ACLNN_IREE_CACHE", str(cache))
    monkeypatch.delenv("ACLNN_IREE_ARTIFACTS", raising=False)
    monkeypatch.setattr(store, "PROJECT_ARTIFACTS", tmp_path / "no-project-artifacts")
    no_loaded_modules(monkeypatch)
    spec = GridSamplerSpec("nearest", "reflection", True, "float32")
    store.set_offline(True)
    store.set_artifacts_dir(empty)
    try:
        with pytest.raises(store.ArtifactMissing) as ei:
            store.load_module_bytes(spec, "local-task")
        msg = str(ei.value)
        assert spec.kernel_name in msg
        assert str(empty / "llvm-cpu" / (spec.kernel_name + ".vmfb")) in msg
        assert str(cache / "llvm-cpu" / (spec.kernel_name + ".vmfb")) in msg
        x = np.zeros((1, 1, 4, 4), np.float32)
        with pytest.raises(AclnnError) as ei:
            aclnn_iree.grid_sampler_2d_backward(x, x, np.zeros((1, 4, 4, 2), np.float32), 1, 2, True)
        assert ei.value.status == ACLNN_ERR_INNER_FIND_KERNEL_ERROR == 561003
        assert spec.kernel_name in str(ei.value)
        # (its jinja2/ folder may hold the compiled templates: render.py, not modules)
        assert not [p for p in cache.iterdir() if p.name != "jinja2"], "offline mode compiled something"
    finally:
        store.set_offline(None)
        store.set_artifacts_dir(None)


def _run_cli(*args, env_extra=None, timeout=600):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "aclnn_iree", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(REPO))


def test_cli_build_and_list(tmp_path):
    out = tmp_path / "artifacts"
    sel = ["--op", "grid_sampler_2d_backward", "--dtype", "float32", "--kernel", "*_bilinear_zeros_*"]
    p = _run_cli("build", *sel, "--out", str(out), "--jobs", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "summary: compiled 2, reused 0, failed 0 of 2" in p.stdout
    assert "\r" not in p.stderr  # no progress bar where stderr is not a terminal (a log file, CI)
    p = _run_cli("build", *sel, "--out", str(out), "--jobs", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "summary: compiled 0, reused 2, failed 0 of 2" in p.stdout
    assert "nothing to compile" in p.stdout
    m = json.loads((out / "manifest.json").read_text())["artifacts"]
    assert sorted(m) == ["llvm-cpu/grid_sampler_2d_backward_bilinear_zeros_ac0_f32",
                         "llvm-cpu/grid_sampler_2d_backward_bilinear_zeros_ac1_f32"]

    p = _run_cli("list", "--dir", str(out), "--dtype", "float32", "--op", "grid_sampler_2d_backward")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "llvm-cpu [host]: 2/18 built, 16 missing" in p.stdout
    assert "... and 11 more missing (-v lists them)" in p.stdout  # 16 names: the first 5 shown
    assert "vulkan-spirv: 0/18 built, 18 missing" in p.stdout and "cuda [sm_80]: 0/18 built" in p.stdout
    p = _run_cli("list", "--dir", str(out), "--dtype", "float32", "--op", "grid_sampler_2d_backward", "--target",
                 "llvm-cpu", "-v")
    assert "missing: grid_sampler_2d_backward_bicubic_reflection_ac1_f32" in p.stdout
    assert "missing: grid_sampler_2d_backward_bilinear_zeros_ac0_f32" not in p.stdout


def test_cli_list_reports_corrupt(store_copy, capsys):
    spec = GRID_SPECS[0]
    Path(store_copy.paths(spec, TARGET)["vmfb"]).write_bytes(b"garbage")
    assert cli.main(["list", "--dir", store_copy.root, "--target", "llvm-cpu", "--dtype", "float32", "-v"]) == 0
    out = capsys.readouterr().out
    n = len(list(all_specs(None, ["float32"])))
    assert f"llvm-cpu [host]: {len(SPECS) - 1}/{n} built" in out
    assert f"corrupt: {spec.kernel_name}" in out


def test_cli_help():
    p = _run_cli("--help")
    assert p.returncode == 0 and all(c in p.stdout for c in ("build", "list", "demo"))
    exe = Path(sys.executable).parent / "aclnn-iree"
    if exe.exists():
        p = subprocess.run([str(exe), "build", "--help"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "--target-cpu" in p.stdout and "--jobs" in p.stdout


def _wheel_build_unavailable():
    """Why `pip wheel --no-build-isolation` cannot build here (pyproject: setuptools>=68 and wheel), or None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        v = tuple(int(p) for p in version("setuptools").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return "setuptools is not installed"
    if v < (68, 0):
        return f"setuptools {version('setuptools')} < 68"
    if v < (70, 1) and importlib.util.find_spec("wheel") is None:
        return "setuptools < 70.1 needs the wheel package, which is not installed"
    return None


@pytest.mark.skipif(_wheel_build_unavailable() is not None, reason=str(_wheel_build_unavailable()))
def test_wheel_contains_templates_and_subpackages(tmp_path):
    # Build from a clean copy of the sources, so that setuptools' build/ and
    # egg-info directories never land in the working tree.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "artifacts", "demo_output", "__pycache__", "*.egg-info", ".pytest_cache",
        ".hypothesis", "*.vmfb", ".venv", "venv"))
    out = tmp_path / "wheels"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    wheels = list(out.glob("aclnn_iree-*.whl"))
    assert len(wheels) == 1
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    templates = {n for n in names if n.startswith("aclnn_iree/templates/") and n.endswith(".mlir.j2")}
    assert "aclnn_iree/templates/grid_sampler_2d_backward/module.mlir.j2" in templates
    assert templates == {f"aclnn_iree/templates/{p.relative_to(TEMPLATES).as_posix()}" for p in TEMPLATES.rglob("*.mlir.j2")}
    for required in ("aclnn_iree/compiler/specs.py", "aclnn_iree/runtime/store.py", "aclnn_iree/cli.py",
                     "aclnn_iree/tools/demo.py", "aclnn_iree/__main__.py",
                     "aclnn_iree/core/aclnn.py", "aclnn_iree/ops/registry.py"):
        assert required in names, f"{required} missing from the wheel"
    ep = next(n for n in names if n.endswith("entry_points.txt"))
    assert "aclnn-iree = aclnn_iree.cli:main" in zipfile.ZipFile(wheels[0]).read(ep).decode()
    for required in ("aclnn_iree/torch/__init__.py", "aclnn_iree/torch/ops.py", "aclnn_iree/tools/stereo.py"):
        assert required in names, f"{required} missing from the wheel"
    # Installed (not editable), the package builds into the per-user data directory, never
    # into site-packages, and names the install command for such an installation.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheels[0])], check=True, capture_output=True, timeout=600)
    code = ("import platformdirs, aclnn_iree; from aclnn_iree.runtime.store import PROJECT_ARTIFACTS; "
            "from aclnn_iree.core.install import install_command; "
            "print(aclnn_iree.__file__); print(PROJECT_ARTIFACTS); print(platformdirs.user_data_dir('aclnn-iree')); "
            "print(install_command('demo'))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert p.returncode == 0, p.stderr
    where, artifacts, data_dir, hint = p.stdout.split("\n")[:4]
    assert where.startswith(str(site))
    assert artifacts == str(Path(data_dir) / "artifacts") and not artifacts.startswith(str(site))
    assert hint == "pip install 'aclnn-iree[demo]'"


def test_named_cpu_build_does_not_replace_the_host_build(tmp_path):
    """A portable build (--target-cpu x86-64-v3) lives in its own folder beside the host one."""
    from aclnn_iree.compiler.targets import get_target
    spec = GridSamplerSpec("nearest", "zeros", False, "float32")
    st = ArtifactStore(tmp_path)
    host, portable = get_target("llvm-cpu"), get_target("llvm-cpu", "x86-64-v3")
    st.build_one(spec, host)
    st.build_one(spec, portable)
    assert st.paths(spec, host)["vmfb"] != st.paths(spec, portable)["vmfb"]
    assert "llvm-cpu-x86-64-v3" in st.paths(spec, portable)["vmfb"]
    assert st.lookup(spec, host) is not None and st.lookup(spec, portable) is not None
    arts = st.manifest()["artifacts"]
    assert arts[f"llvm-cpu/{spec.kernel_name}"]["target_cpu"] == "host"
    assert arts[f"llvm-cpu-x86-64-v3/{spec.kernel_name}"]["target_cpu"] == "x86-64-v3"
