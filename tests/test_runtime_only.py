"""Running without the compiler: a machine with iree-base-runtime and modules built elsewhere
(`aclnn-iree build --target-cpu x86-64-v3`, `--target cuda`) runs them, says how to build a
missing one and never tries to compile (docs/build.md#running-without-the-compiler).

The child processes make `import iree.compiler` fail (sys.modules entry None), which is what
an install without iree-base-compiler sees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from aclnn_iree import cli
from aclnn_iree.compiler import get_target, target_for_driver
from aclnn_iree.compiler.build import ArtifactStore, target_folder
from aclnn_iree.compiler.targets import CPU_ARCH_ENV, build_args

PORTABLE_CPU = "x86-64-v3"
NO_COMPILER = "import sys; sys.modules['iree.compiler'] = None\n"


def _run_without_compiler(code: str, env: dict, args=()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_COMPILER + textwrap.dedent(code), *args],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=600)


def test_the_cpu_arch_variable_picks_the_named_cpu_modules(monkeypatch):
    monkeypatch.delenv(CPU_ARCH_ENV, raising=False)
    assert target_for_driver("local-task") == get_target("llvm-cpu")
    monkeypatch.setenv(CPU_ARCH_ENV, PORTABLE_CPU)
    t = target_for_driver("local-sync")
    assert t == get_target("llvm-cpu", PORTABLE_CPU) and target_folder(t) == f"llvm-cpu-{PORTABLE_CPU}"
    assert target_for_driver("vulkan") == get_target("vulkan-spirv")  # GPU targets keep their default
    assert build_args(t) == f"--target llvm-cpu --target-cpu {PORTABLE_CPU}"
    assert build_args(get_target("cuda")) == "--target cuda"
    # a linalg kernel's hint names its form, where the build's default (tuned) would not build it
    assert build_args(get_target("llvm-cpu"), ["linalg"]) == "--target llvm-cpu --form linalg"
    assert build_args(get_target("llvm-cpu"), ["linalg", "tuned"]) == "--target llvm-cpu --form all"
    assert build_args(get_target("vmvx"), ["linalg"]) == "--target vmvx"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64-v3 modules need an x86-64 CPU")
def test_prebuilt_modules_run_and_missing_ones_name_the_build(tmp_path, capsys):
    out = tmp_path / "prebuilt"
    rc = cli.main(["build", "--target-cpu", PORTABLE_CPU, "--kernel", "upsample_bilinear2d_backward_nchw_ac0_f64",
                   "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr()
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {"ACLNN_IREE_ARTIFACTS": str(out), "ACLNN_IREE_CACHE": str(cache), CPU_ARCH_ENV: PORTABLE_CPU,
           "ACLNN_IREE_OFFLINE": ""}
    proc = _run_without_compiler("""
        import json
        import numpy as np
        from aclnn_iree.core import api
        from aclnn_iree.ops import reference
        from aclnn_iree.compiler.compile import compiler_available
        from aclnn_iree.core.errors import AclnnError
        from aclnn_iree.runtime.kernels import load_module
        from aclnn_iree.runtime.device import get_device
        from aclnn_iree.compiler import UpsampleSpec
        assert not compiler_available()
        go = np.random.default_rng(0).standard_normal((2, 3, 7, 9))
        got = api.upsample_bilinear2d_backward(go, (7, 9), (2, 3, 4, 5), False)
        want = reference.upsample_bilinear2d_backward(go, (7, 9), (2, 3, 4, 5), False)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        path = load_module(get_device("local-task"), UpsampleSpec(False, "float64")).path
        try:
            api.upsample_bilinear2d_backward(go.astype(np.float32), (7, 9), (2, 3, 4, 5), False)
            missing = None
        except AclnnError as e:
            missing = [e.status, str(e)]
        print(json.dumps({"err": err, "path": path, "missing": missing}))
        """, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["err"] < 1e-12  # float64 kernel vs the float64 reference
    assert r["path"].startswith(str(out / f"llvm-cpu-{PORTABLE_CPU}"))
    status, message = r["missing"]
    assert status == 561003  # ACLNN_ERR_INNER_FIND_KERNEL_ERROR
    assert "iree-base-compiler is not installed" in message
    assert "upsample_bilinear2d_backward_nchw_ac0_f32" in message
    assert f"aclnn-iree build --target llvm-cpu --target-cpu {PORTABLE_CPU}" in message
    # nothing was compiled or written into the cache but the compiled templates (render.py)
    assert [p.name for p in cache.iterdir()] in ([], ["jinja2"])

    # The entry was checked, not just found: a changed template (here: its recorded key) is stale.
    store = ArtifactStore(out)
    m = store.manifest()
    (entry,) = m["artifacts"].values()
    entry["key"] = "0" * 64
    (out / "manifest.json").write_text(json.dumps(m))
    proc = _run_without_compiler("""
        import numpy as np
        from aclnn_iree.core import api
        from aclnn_iree.core.errors import AclnnError
        try:
            api.upsample_bilinear2d_backward(np.ones((1, 1, 2, 2)), (2, 2), (1, 1, 1, 1), False)
        except AclnnError as e:
            print(e)
        """, env)
    assert "stale" in proc.stdout and "not installed" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_build_without_the_compiler_is_one_line(tmp_path):
    proc = _run_without_compiler("from aclnn_iree.cli import main; raise SystemExit(main())",
                                 {}, ["build", "--kernel", "*ac0_f32", "--out", str(tmp_path / "a"),
                                      "--no-progress"])
    assert proc.returncode == 1
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: iree-base-compiler is not installed"), proc.stderr
    assert "pip install iree-base-compiler" in err[0]
