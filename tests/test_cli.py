"""The `aclnn-iree` command as a new user meets it: a user's mistake or an unavailable resource
is one line ("error: ..."), never a traceback (README "Quick start", issue "First-run
experience").  Each case runs the command in a subprocess."""
from __future__ import annotations

import os
import shutil
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


def assert_one_error_line(p, *words, code=1):
    """`p` failed with exit status `code` (1: a failure, 2: a bad command line) and one line
    "error: ..." holding `words`, without a traceback."""
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    assert p.returncode == code, out
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


def test_a_device_no_driver_has_is_a_usage_error(tmp_path):
    """A --device that names no IREE driver is a bad command line (exit 2), said before any
    work, in both subcommands that take one; a known driver this machine lacks is a failure
    (exit 1, above)."""
    for args in (["bench", "--device", "bogus", "--quick"], ["demo", "--device", "bogus", "--out", str(tmp_path)]):
        assert_one_error_line(cli(*args), "'bogus'", "local-task", code=2)


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
    assert_one_error_line(cli("list", "--dir", str(a_file)), "is not a directory", str(a_file), code=2)


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
    assert_one_error_line(cli("bench", "--threads", "0"), "argument --threads", "from 1 to 1024", code=2)
    # PyTorch itself crashes (SIGSEGV) on 100000 threads: refused before it is asked.
    assert_one_error_line(cli("bench", "--threads", "100000"), "argument --threads", "got '100000'", code=2)


def test_options_that_do_not_apply_are_one_line():
    assert_one_error_line(cli("bench", "--op", "torch", "--peers"), "--peers")


@pytest.mark.parametrize("arch", ["rm -rf", "sm_999x", "80"])
def test_a_malformed_gpu_arch_is_one_line(arch, tmp_path):
    p = cli("build", "--target", "cuda", "--gpu-arch", arch, "--kernel", "*nearest_zeros_ac0_f32",
            "--out", str(tmp_path), "--no-progress")
    assert_one_error_line(p, "--gpu-arch", "is not a cuda architecture", "sm_86", code=2)


# ----------------------------------------------------------------------------- issue 47: CLI rough edges
# In this process (capsys), where a subprocess is not the point: the machine's 2 cores are shared.
KERNEL = "grid_sampler_2d_backward_nearest_zeros_ac0_f32"


def run_main(capsys, *args):
    """Runs `aclnn-iree ARGS` in this process: (exit status, stdout, stderr).  argparse's own
    errors and --help end in SystemExit, whose code is the status."""
    from aclnn_iree.cli import main
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(result, *words) -> str:
    """`result` (run_main's) is a bad command line: exit status 2 and one line "error: ..." holding `words`."""
    code, out, err = result
    assert "Traceback" not in out + err, out + err
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def _compiler_available() -> bool:
    from aclnn_iree.compiler.compile import compiler_available
    return compiler_available()


needs_compiler = pytest.mark.skipif(not _compiler_available(), reason="needs iree-base-compiler")


@pytest.fixture(scope="module")
def built_kernel(tmp_path_factory) -> Path:
    """A store holding KERNEL's llvm-cpu module, compiled once for this file's tests."""
    from aclnn_iree.compiler import all_specs, get_target
    from aclnn_iree.compiler.build import ArtifactStore
    spec = next(s for s in all_specs(None, None) if s.kernel_name == KERNEL)
    store = ArtifactStore(tmp_path_factory.mktemp("built") / "store")
    store.build_one(spec, get_target("llvm-cpu"))
    return Path(store.root)


@needs_compiler
def test_an_unknown_target_cpu_is_one_line_before_anything_compiles(tmp_path, capsys):
    """iree-compile answered `--target-cpu bogus` with LLVM's list of CPUs and "LLVM ERROR:
    64-bit code requested on a subtarget that doesn't support it!", once per module."""
    out_dir = tmp_path / "out"
    for sub in (["build", "--out", str(out_dir), "--no-progress"], ["list", "--dir", str(tmp_path)]):
        err = assert_usage_error(run_main(capsys, *sub, "--target-cpu", "bogus", "--kernel", KERNEL),
                                 "--target-cpu 'bogus' is not a CPU iree-compile knows", "use host",
                                 "`aclnn-iree build --target-cpu help` lists them")
        assert "LLVM ERROR" not in err and "accepted" not in err
    assert not out_dir.exists()  # refused before the store was made
    code, out, err = run_main(capsys, "build", "--target-cpu", "help")
    names = out.strip().split(", ")
    assert code == 0 and not err and len(out.splitlines()) == 1
    assert names[:2] == ["host (this machine's CPU)", "generic"] and len(names) > 10, out
    from aclnn_iree.compiler.targets import cpu_isa
    if cpu_isa() == "x86":
        assert "x86-64-v3" in names and "haswell" in names
    # a CPU from that list passes the check
    code, out, err = run_main(capsys, "list", "--dir", str(tmp_path / "empty"), "--target", "llvm-cpu",
                              "--target-cpu", names[-1])
    assert code == 0 and not err and "nothing is built yet" in out


@needs_compiler
@pytest.mark.parametrize("target,arch,words", [
    ("cuda", "sm_999", ("it knows sm_60", "sm_80, sm_86", "(e.g. sm_86)")),
    ("cuda", "sm_35", ("it knows sm_60",)),
    ("vulkan-spirv", "bogus", ("IREE's Vulkan profiles", "ampere")),
])
def test_a_gpu_arch_the_compiler_does_not_know_is_one_line_before_anything_compiles(target, arch, words, tmp_path,
                                                                                   capsys):
    """`--target cuda --gpu-arch sm_999` printed ~200 lines of MLIR per module (IREE 3.13 has no
    table for it: "missing GPU target in #hal.executable.target")."""
    out_dir = tmp_path / "out"
    t = time.perf_counter()
    err = assert_usage_error(run_main(capsys, "build", "--target", target, "--gpu-arch", arch, "--kernel", KERNEL,
                                      "--out", str(out_dir), "--no-progress"),
                             f"--gpu-arch {arch!r} is not a {target} architecture iree-compile knows", *words)
    assert "func.func" not in err and not out_dir.exists()
    assert time.perf_counter() - t < 30


@needs_compiler
def test_a_gpu_arch_the_compiler_knows_passes_the_check(tmp_path, capsys):
    for target, arch in (("cuda", "sm_86"), ("vulkan-spirv", "ampere")):
        code, out, err = run_main(capsys, "list", "--dir", str(tmp_path), "--target", target, "--gpu-arch", arch)
        assert code == 0 and not err, err
    # without --target, `list` shows the GPU targets that know the arch (--gpu-arch applies to both)
    code, out, err = run_main(capsys, "list", "--dir", str(tmp_path), "-v", "--kernel", KERNEL, "--gpu-arch", "rdna3")
    assert code == 0 and not err and "\nvulkan-spirv [rdna3]: 0/1 built" in out and "cuda" not in out, out + err


def test_a_failed_compile_is_a_few_lines_and_its_whole_message_a_file(built_kernel, tmp_path, monkeypatch, capsys):
    """A compile's message can be hundreds of lines (IREE prints the module's MLIR): `build`
    says the first error line and where the whole message is; the next good build removes it."""
    import aclnn_iree.compiler.build as build_mod
    from aclnn_iree.compiler.compile import CompileError
    message = "k.mlir:3:7: error: 'func.func' op failed to legalize\n" + "\n".join(
        f"    %{i} = arith.addf %a, %b : f32" for i in range(300))

    def broken(path, flags):
        raise CompileError(KERNEL, ["iree-compile", *flags, os.path.basename(path), "-o", "-"], message, "")
    monkeypatch.setattr(build_mod, "compile_file", broken)
    out_dir = tmp_path / "out"
    code, out, err = run_main(capsys, "build", "--kernel", KERNEL, "--out", str(out_dir), "--no-progress")
    assert code == 1 and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    log = out_dir / "llvm-cpu" / f"{KERNEL}.compile-error.log"
    assert lines == [f"FAILED llvm-cpu/{KERNEL}: k.mlir:3:7: error: 'func.func' op failed to legalize",
                     "  specialisation: GridSamplerSpec(interpolation_mode='nearest', padding_mode='zeros', "
                     "align_corners=False, dtype='float32', form='tuned')",
                     lines[2],
                     f"  whole message (302 lines): {log}",
                     "1 specialisation(s) failed to compile (see above)"], err
    assert lines[2].startswith("  command: iree-compile --iree-hal-target-device=local")
    assert "arith.addf" not in err and "summary: compiled 0, reused 0, failed 1 of 1" in out
    assert log.read_text().splitlines()[1:] == message.splitlines()  # after the command line
    # once it builds (here: the module is there already), the old message goes
    monkeypatch.undo()
    shutil.rmtree(out_dir)
    shutil.copytree(built_kernel, out_dir)
    log.parent.mkdir(exist_ok=True)
    log.write_text("an older build's message\n")
    code, out, err = run_main(capsys, "build", "--kernel", KERNEL, "--out", str(out_dir), "--no-progress")
    assert code == 0 and "reused 1" in out and not log.exists(), out + err


@pytest.mark.parametrize("args,pattern", [
    (["list", "--kernel", "zzz"], "zzz"),
    (["build", "--kernel", "nomatch*"], "nomatch*"),
    (["list", "--kernel", f"{KERNEL[:-4]}*", "--kernel", "zzz"], "zzz"),  # one typo among good patterns
])
def test_a_kernel_pattern_that_matches_nothing_is_a_usage_error(args, pattern, tmp_path, capsys):
    """`list --kernel zzz` said "0/0 built" and exited 0 where `build` refused it."""
    assert_usage_error(run_main(capsys, *args, *(["--out", str(tmp_path)] if args[0] == "build" else [])),
                       f"no kernel matches {pattern!r}", "`aclnn-iree list -v` lists them")
    assert not list(tmp_path.iterdir())


def test_a_kernel_pattern_of_another_op_says_so(capsys):
    assert_usage_error(run_main(capsys, "list", "--op", "grid_sampler_2d_backward", "--kernel", "upsample*"),
                       "no kernel of the chosen --op/--dtype matches 'upsample*'")


@pytest.mark.parametrize("args", [
    ("build", "--jobs", "0"), ("build", "-j", "-3"), ("build", "--jobs", "two"),
    ("bench", "--threads", "0"), ("bench", "--threads", "1e3"), ("bench", "--threads", "4096"),
    ("bench", "--repeats", "0"), ("bench", "--repeats", "x"),
])
def test_every_bad_number_is_a_usage_error(args, capsys):
    """`build --jobs 0` exited 2 and `bench --threads 0` 1: every bad number is a bad command line."""
    sub, option, value = args
    name = "--jobs/-j" if option in ("--jobs", "-j") else option
    assert_usage_error(run_main(capsys, *args), f"argument {name}:", "must be a whole number", f"got {value!r}",
                       f"`aclnn-iree {sub} --help`")


def test_an_argparse_error_is_one_line(capsys):
    assert_usage_error(run_main(capsys, "build", "--target", "tpu"), "argument --target: invalid choice: 'tpu'")
    assert_usage_error(run_main(capsys, "list", "--no-such-option"), "unrecognized arguments: --no-such-option")


def test_an_output_path_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    """`demo --out /etc/hostname` said "File exists"."""
    a_file = tmp_path / "hostname"
    a_file.write_text("")
    assert_one_error_line(cli("demo", "--out", str(a_file)), f"--out {a_file} is not a directory", code=2)
    for args in (["demo", "--photo", "--out", str(a_file)], ["build", "--kernel", KERNEL, "--out", str(a_file)]):
        err = assert_usage_error(run_main(capsys, *args), f"--out {a_file} is not a directory")
        assert "File exists" not in err
    assert a_file.read_text() == ""


def test_list_counts_the_modules_of_every_store_the_runtime_searches(built_kernel, tmp_path, monkeypatch, capsys):
    """`list` said "vulkan-spirv: 0/88 built" with every module in the compile cache, and
    nothing said that ACLNN_IREE_ARTIFACTS adds a store rather than replacing artifacts/."""
    from aclnn_iree.core.install import source_checkout
    from aclnn_iree.runtime import store
    env_store, cache, project = tmp_path / "env", tmp_path / "cache", tmp_path / "artifacts"
    cache.mkdir()
    monkeypatch.delenv("ACLNN_IREE_ARTIFACTS", raising=False)
    monkeypatch.setenv("ACLNN_IREE_CACHE", str(cache))
    monkeypatch.setattr(store, "PROJECT_ARTIFACTS", project)
    sel = ["--target", "llvm-cpu", "--kernel", KERNEL]
    code, out, err = run_main(capsys, "list", *sel)
    assert code == 0 and not err and f"nothing is built yet in {project} or {cache}" in out, out + err

    shutil.rmtree(cache)
    shutil.copytree(built_kernel, env_store)
    shutil.copytree(built_kernel, cache)
    project.mkdir()
    monkeypatch.setenv("ACLNN_IREE_ARTIFACTS", str(env_store))
    code, out, err = run_main(capsys, "list", *sel, "-v")
    assert code == 0 and not err, err
    where = "the checkout's artifacts/" if source_checkout() else "the default store"
    assert out.splitlines()[0] == (f"modules are looked for in ACLNN_IREE_ARTIFACTS={env_store}, then {project} "
                                   f"(where `aclnn-iree build` writes), then the compile cache {cache} (where first "
                                   f"use compiles them)")
    assert "llvm-cpu [host]: 1/1 built, 0 missing" in out
    assert f"\n  1 in ACLNN_IREE_ARTIFACTS {env_store} (" in out and f"\n  0 in {where} {project}\n" in out
    assert f"\n  1 in the compile cache {cache} (" in out
    assert f"\n    {KERNEL}  (ACLNN_IREE_ARTIFACTS)\n" in out  # where the runtime loads it from

    monkeypatch.delenv("ACLNN_IREE_ARTIFACTS")
    code, out, err = run_main(capsys, "list", *sel, "-v")
    assert code == 0 and "llvm-cpu [host]: 1/1 built, 0 missing" in out, out + err
    assert out.splitlines()[0].endswith("; ACLNN_IREE_ARTIFACTS=DIR would add DIR before them")
    assert f"\n  1 in the compile cache {cache} (" in out and f"\n    {KERNEL}  (the compile cache)\n" in out


def test_build_and_list_help_say_the_search_order(capsys):
    for sub in ("build", "list"):
        code, out, _ = run_main(capsys, sub, "--help")
        order = ("Modules are looked for in $ACLNN_IREE_ARTIFACTS when set (a store it adds, hiding none), then in the "
                 "default store (the checkout's artifacts/, else the per-user data directory), then in the compile "
                 "cache ($ACLNN_IREE_CACHE, else ~/.cache/aclnn-iree), where first use compiles them.")
        assert code == 0 and "".join(order.split()) in "".join(out.split()), out  # as argparse wraps it


@pytest.mark.parametrize("args", [["build", "--out", ""], ["list", "--dir", " "], ["build", "--target-cpu", ""],
                                  ["build", "--target", "cuda", "--gpu-arch", ""], ["demo", "--out", ""],
                                  ["bench", "--json", ""]], ids=lambda a: " ".join(a))
def test_empty_values_are_usage_errors(args):
    """An empty value (a script's unset variable) is a bad command line, never the default it
    would otherwise fall back to (`build --out ""` had built into the checkout's artifacts/)."""
    assert_one_error_line(cli(*args), "is empty", code=2)


@pytest.mark.parametrize("value", ["+3", " 2", "1_000", "\u0663", "99999999999999999999999"])
def test_counts_take_plain_digits_only(value):
    """--jobs takes plain ASCII digits within its bound (int() would take these)."""
    assert_one_error_line(cli("build", "--jobs", value), "whole number", code=2)


def test_json_to_a_fifo_is_refused_at_once(tmp_path):
    """`bench --json` naming a FIFO is refused before any work (opening it for writing had
    blocked until a reader came: a hang)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_one_error_line(cli("bench", "--json", str(fifo), "--quick", timeout=60), "not a regular file", code=2)


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink_loop"])
def test_a_store_whose_manifest_is_not_a_file_is_one_line(tmp_path, kind):
    """A FIFO, a directory or a self-looping symlink where `build --out` and `list --dir` expect
    manifest.json: build compiled every module first, then reported each as failed to compile;
    list said nothing was built.  Now both say, in one line, that the manifest is unreadable
    (build before compiling anything)."""
    path = tmp_path / "manifest.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    else:
        os.symlink("manifest.json", path)
    r = cli("build", "--target", "llvm-cpu", "--kernel", "upsample_bilinear2d_nchw_ac0_f32", "--out", str(tmp_path),
            "--no-progress", timeout=60)
    assert_one_error_line(r, "manifest cannot be read", code=1)
    assert not list(tmp_path.glob("**/*.vmfb")), "nothing compiles"
    assert_one_error_line(cli("list", "--dir", str(tmp_path), timeout=60), "cannot read", code=1)


def test_bench_torch_on_cuda_without_a_gpu_is_one_line():
    """`bench --op torch --device cuda` times the training steps on CUDA tensors (both launches
    of ours); where PyTorch sees no CUDA device it says so in one line, and other devices are
    refused as the kernel cases' options."""
    import torch
    p = cli("bench", "--op", "torch", "--device", "cuda", "--quick", "--repeats", "1")
    if torch.cuda.is_available():
        assert p.returncode == 0 and "ours stream" in p.stdout, p.stderr
        return
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "cuda" in lines[0] and "not available" in lines[0], p.stderr
    p = cli("bench", "--op", "torch", "--device", "vulkan", "--quick")
    assert p.returncode != 0 and "other devices apply to the kernel cases" in p.stderr and "Traceback" not in p.stderr
