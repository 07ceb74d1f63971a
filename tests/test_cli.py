"""The `aclnn-iree` command as a new user meets it: a user's mistake or an unavailable resource
is one line ("error: ..."), never a traceback (README "Quick start", issue "First-run
experience").  Each case runs the command in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def cli(*args, env=None, block_torch=False, user=None, timeout=300, cwd=None):
    """Runs `aclnn-iree ARGS`; returns the CompletedProcess.  block_torch: as if PyTorch were not
    installed; user: (uid, gid) to run as."""
    code = "import sys\n"
    if block_torch:
        code += "sys.modules['torch'] = None\n"
    code += f"from aclnn_iree.cli import main\nsys.exit(main({list(args)!r}))\n"

    def drop():
        os.setgid(user[1])
        os.setuid(user[0])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, preexec_fn=drop if user else None,
                          cwd=cwd or str(REPO))


def assert_one_error_line(p, *words):
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    assert p.returncode == 1, out
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, p.stderr
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def _nobody_can_import() -> bool:
    if os.getuid() != 0:
        return False
    try:
        p = subprocess.run([sys.executable, "-c", "import aclnn_iree.cli"], capture_output=True,
                           preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)), cwd="/", timeout=120)
    except OSError:  # e.g. the interpreter under /root
        return False
    return p.returncode == 0


@pytest.fixture
def unwritable(tmp_path):
    """(directory the command cannot write into, how to run the command: user or None)."""
    if os.getuid() != 0:
        d = tmp_path / "read-only"
        d.mkdir()
        d.chmod(0o555)
        yield d, None
        d.chmod(0o755)
    elif _nobody_can_import():
        import tempfile
        base = Path(tempfile.mkdtemp(dir="/tmp"))
        base.chmod(0o755)
        d = base / "read-only"
        d.mkdir(mode=0o755)  # root's: nobody cannot write it
        yield d, (65534, 65534)
    else:  # root, and nobody cannot run Python here: a path under a regular file
        f = tmp_path / "a-file"
        f.write_text("")
        yield f / "sub", None


def test_unavailable_device_is_one_line_in_every_subcommand(tmp_path):
    from aclnn_iree.runtime.device import DeviceUnavailable, get_device
    try:
        get_device("cuda")
        pytest.skip("this machine has an IREE cuda device")
    except DeviceUnavailable:
        pass
    for args in (["bench", "--device", "cuda", "--quick"], ["demo", "--device", "cuda", "--out", str(tmp_path)],
                 ["demo", "--photo", "--device", "cuda", "--out", str(tmp_path)]):
        line = assert_one_error_line(cli(*args), "'cuda'", "not available", "--device")
        assert "stream must be" not in line


def test_unwritable_output_directories(unwritable, tmp_path):
    d, user = unwritable
    env = {"ACLNN_IREE_CACHE": str(tmp_path / "cache")}
    if user:
        (tmp_path / "cache").mkdir()
        os.chmod(tmp_path / "cache", 0o777)
        os.chmod(tmp_path, 0o755)
    t = time.perf_counter()
    p = cli("build", "--out", str(d), "--kernel", "*bilinear_zeros_ac0_f32", "--no-progress", env=env, user=user)
    assert_one_error_line(p, "cannot write the artifacts", str(d))
    assert "compiling" not in p.stdout + p.stderr and "summary" not in p.stdout  # refused before compiling
    assert_one_error_line(cli("demo", "--out", str(d), env=env, user=user), "cannot write", str(d))
    json_path = d / "results.json"
    p = cli("bench", "--json", str(json_path), "--quick", env=env, user=user)
    assert_one_error_line(p, "cannot write the benchmark results", str(json_path))
    assert "case" not in p.stdout  # refused before the benchmark ran
    assert time.perf_counter() - t < 120


def test_demo_without_the_demo_extra_names_the_install_command(tmp_path):
    from aclnn_iree.core.install import install_command
    line = assert_one_error_line(cli("demo", "--quick", "--out", str(tmp_path), block_torch=True), "PyTorch")
    assert install_command("demo") in line


def test_bench_without_torch_names_the_install_command():
    from aclnn_iree.core.install import install_command
    p = cli("bench", "--quick", "--no-compile", "--threads", "1", "--repeats", "1", "--op",
            "upsample_bilinear2d_backward", block_torch=True, timeout=600)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert f"torch is not installed: PyTorch columns are empty ({install_command('torch')} adds it)" in p.stdout


def test_list_into_a_closed_pipe_ends_quietly(tmp_path):
    from aclnn_iree.compiler import get_target
    from aclnn_iree.compiler.build import ArtifactStore
    from aclnn_iree.compiler.specs import GridSamplerSpec
    store = ArtifactStore(tmp_path / "store")
    store.build_one(GridSamplerSpec("nearest", "zeros", False, "float32"), get_target("llvm-cpu"))
    code = f"from aclnn_iree.cli import main; import sys; sys.exit(main(['list', '--dir', {store.root!r}, '-v']))"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.readline()
    p.stdout.close()  # as `| head -1` does
    err = p.stderr.read()
    p.wait(120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_list_before_any_build_says_how_to_build(tmp_path):
    p = cli("list", "--dir", str(tmp_path / "nothing-here"))
    assert p.returncode == 0 and "Traceback" not in p.stderr
    assert "nothing is built yet" in p.stdout and "aclnn-iree build" in p.stdout
    assert "does not exist" not in p.stdout
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert_one_error_line(cli("list", "--dir", str(a_file)), "is not a directory", str(a_file))


def test_demo_refuses_an_output_file_that_is_a_directory_before_the_job(tmp_path):
    (tmp_path / "results.json").mkdir()
    t = time.perf_counter()
    assert_one_error_line(cli("demo", "--quick", "--out", str(tmp_path)), "is a directory", "results.json")
    assert time.perf_counter() - t < 10 and not (tmp_path / "stereo.png").exists()  # before the imports and job


def test_version_and_every_subcommand_describes_itself():
    from importlib.metadata import version
    p = cli("--version")
    assert p.returncode == 0
    assert f"aclnn-iree {version('aclnn-iree')}" in p.stdout and f"iree-base-compiler {version('iree-base-compiler')}" \
        in p.stdout and f"iree-base-runtime {version('iree-base-runtime')}" in p.stdout
    for sub in ("build", "list", "demo", "bench"):
        p = cli(sub, "--help")
        assert p.returncode == 0, p.stderr
        usage, _, rest = p.stdout.partition("\n\n")
        description = rest.split("\n\n")[0].strip()
        assert description and not description.startswith(("options", "positional")), (sub, p.stdout[:400])


def test_bad_numbers_are_one_line():
    assert_one_error_line(cli("bench", "--threads", "0"), "--threads")
    # PyTorch itself crashes (SIGSEGV) on 100000 threads: refused before it is asked.
    assert_one_error_line(cli("bench", "--threads", "100000"), "--threads is at most")


def test_options_that_do_not_apply_are_one_line():
    assert_one_error_line(cli("bench", "--op", "torch", "--peers"), "--peers")


@pytest.mark.parametrize("arch", ["rm -rf", "sm_999x", "80"])
def test_a_malformed_gpu_arch_is_one_line(arch, tmp_path):
    p = cli("build", "--target", "cuda", "--gpu-arch", arch, "--kernel", "*nearest_zeros_ac0_f32",
            "--out", str(tmp_path), "--no-progress")
    assert_one_error_line(p, "is not a cuda architecture", "sm_86")
