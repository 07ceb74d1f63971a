"""The artifact store and compile cache under concurrency and damage (issue: "a store that
loses entries under concurrency"): reproducible compiles, an inter-process lock around the
manifest, malformed entries, file modes, unreadable files, stale temporaries and modules
that IREE cannot load.  Each test repeats what an attack did."""
from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import aclnn_iree
from aclnn_iree.compiler import GridSamplerSpec, UpsampleSpec, get_target
from aclnn_iree.compiler.build import ArtifactStore
from aclnn_iree.core.errors import ACLNN_ERR_INNER_FIND_KERNEL_ERROR, AclnnError
from aclnn_iree.runtime import kernels, store
from conftest import no_loaded_modules

TARGET = get_target("llvm-cpu")
SPEC = GridSamplerSpec("bilinear", "zeros", False, "float32")
# Six specialisations per process, two processes, none shared (the attack's 2 x 6)
SIX_A = [GridSamplerSpec(m, p, False, "float32") for m in ("bilinear", "nearest") for p in ("zeros", "border",
                                                                                              "reflection")]
SIX_B = [UpsampleSpec(ac, "float32", lay) for ac in (False, True) for lay in ("NCHW", "NHWC")] + \
        [GridSamplerSpec("nearest", p, True, "float32") for p in ("zeros", "border")]


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _child(code: str, env: dict, timeout: float = 600) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_all(procs, timeout: float = 600):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, f"child exited {p.returncode}:\n{out}\n{err[-3000:]}"
        outs.append(out)
    return outs


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A process whose only artifact directory is an empty compile cache in tmp_path."""
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ACLNN_IREE_CACHE", str(cache))
    monkeypatch.delenv("ACLNN_IREE_ARTIFACTS", raising=False)
    monkeypatch.delenv("ACLNN_IREE_OFFLINE", raising=False)
    monkeypatch.setattr(store, "PROJECT_ARTIFACTS", tmp_path / "no-project-artifacts")
    no_loaded_modules(monkeypatch)
    return cache


# The environment of a child that sees only `cache` (_HIDE hides the project's artifacts/).
def _child_env(cache, offline=False):
    return {"ACLNN_IREE_CACHE": str(cache), "ACLNN_IREE_ARTIFACTS": "", "ACLNN_IREE_OFFLINE": "1" if offline else ""}


_HIDE = """
    import os
    from aclnn_iree.runtime import store
    store.PROJECT_ARTIFACTS = store.PROJECT_ARTIFACTS.parent / "no-such-artifacts"
"""


# ----------------------------------------------------------------------------- reproducible compiles
def test_same_inputs_give_the_same_bytes_in_any_store_and_from_the_recorded_command(tmp_path):
    """The attack: iree-compile embedded its temporary source path, so two compiles of one
    kernel never gave the same bytes and a manifest written by one process disagreed with the
    vmfb written by the other.  Now: two stores, the same bytes; the recorded command, run
    again by a shell, the same bytes again."""
    a, b = ArtifactStore(tmp_path / "a"), ArtifactStore(tmp_path / "b" / "deeper")
    va, ea = a.build_one(SPEC, TARGET)
    vb, eb = b.build_one(SPEC, TARGET)
    assert ea["vmfb_sha256"] == eb["vmfb_sha256"] == hashlib.sha256(va).hexdigest() == hashlib.sha256(vb).hexdigest()
    p = a.paths(SPEC, TARGET)
    os.unlink(p["vmfb"])
    subprocess.run(["bash", p["cmd"]], check=True, timeout=300)
    assert _sha(p["vmfb"]) == ea["vmfb_sha256"]
    assert a.status(SPEC, TARGET) == "ok"


def test_a_compile_writes_nothing_to_tmpdir(tmp_path, monkeypatch):
    """Temporaries stay inside the store (a compile killed with SIGKILL used to leave its
    .mlir and .vmfb in TMPDIR)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    ArtifactStore(tmp_path / "store").build_one(SPEC, TARGET)
    assert list(tmpdir.iterdir()) == []


# ----------------------------------------------------------------------------- concurrency
_JIT_ONE = _HIDE + """
    import numpy as np, aclnn_iree
    x = np.ones((1, 2, 5, 5), np.float32)
    dx, dg = aclnn_iree.grid_sampler_2d_backward(np.ones((1, 2, 3, 4), np.float32), x,
                                                np.zeros((1, 3, 4, 2), np.float32), 0, 0, False)
    assert dx[0, 0, 2, 2] == 12.0, dx
    print("OK")
"""


@pytest.mark.parametrize("trial", range(2))
def test_two_processes_jit_one_kernel_into_one_empty_cache(tmp_path, trial):
    """The attack: two processes compiling the same kernel into an empty cache left a
    manifest whose sha256 did not match the vmfb (2 of 5 trials), and a later offline
    process failed with 561003.  Now the manifest matches and the offline process runs."""
    cache = tmp_path / "cache"
    procs = [_child(_JIT_ONE, _child_env(cache)) for _ in range(2)]
    _wait_all(procs)
    st = ArtifactStore(cache)
    assert st.status(SPEC, TARGET) == "ok"
    assert _wait_all([_child(_JIT_ONE, _child_env(cache, offline=True))])[0].strip().endswith("OK")


_BUILD_SIX = _HIDE + """
    import sys
    from aclnn_iree.compiler import GridSamplerSpec, UpsampleSpec, get_target
    from aclnn_iree.compiler.build import ArtifactStore
    specs = {specs}
    res = ArtifactStore(sys.argv[1] if len(sys.argv) > 1 else {root!r}).build(specs, [get_target("llvm-cpu")],
                                                                            jobs=3, progress=False)
    assert not res.failed and res.compiled == len(specs), res
    print("OK")
"""


def test_two_processes_and_their_threads_keep_every_manifest_entry(tmp_path):
    """The attack: two processes compiling 6 kernels each left 12 vmfb files but 8-10
    manifest entries (threads in one process lost entries too: a new ArtifactStore per call
    locked nothing).  Now every entry survives, and each loads offline."""
    root = tmp_path / "store"
    procs = [_child(_BUILD_SIX.format(specs=repr(six), root=str(root)), {}) for six in (SIX_A, SIX_B)]
    _wait_all(procs)
    st = ArtifactStore(root)
    entries = st.manifest()["artifacts"]
    assert set(entries) == {ArtifactStore.artifact_id(s, TARGET) for s in SIX_A + SIX_B}
    for s in SIX_A + SIX_B:
        data = st.lookup(s, TARGET)
        assert data is not None, s
        kernels.LoadedModule(aclnn_iree.runtime.get_device("local-task"), s, data, TARGET,
                             st.paths(s, TARGET)["vmfb"])


_BUILD_COUNTS = _HIDE + """
    import sys
    from aclnn_iree.compiler import GridSamplerSpec, get_target
    from aclnn_iree.compiler.build import ArtifactStore
    res = ArtifactStore({root!r}).build({specs}, [get_target("llvm-cpu")], jobs=2, progress=False)
    assert not res.failed, res
    print(res.compiled, res.reused)
"""


def test_two_processes_building_the_same_modules_compile_each_once(tmp_path):
    """Two builds of the same modules into one store at once (a probe: both compiled all of
    them, twice the work): each module is compiled by one process, under its compile lock,
    and the other reuses it."""
    specs = SIX_A[:4]
    code = _BUILD_COUNTS.format(root=str(tmp_path / "store"), specs=repr(specs))
    counts = [tuple(map(int, out.split())) for out in _wait_all([_child(code, {}) for _ in range(2)])]
    assert sum(c for c, _ in counts) == len(specs) and sum(r for _, r in counts) == len(specs), counts
    st = ArtifactStore(tmp_path / "store")
    assert all(st.status(s, TARGET) == "ok" for s in specs)


# ----------------------------------------------------------------------------- damage
@pytest.mark.parametrize("bad", [[], "oops", 3, None], ids=["list", "string", "int", "null"])
def test_malformed_manifest_entry_is_corrupt_and_rebuilt(isolated, bad):
    """The attack: a manifest entry of the wrong type made every call of that kernel fail
    with 561000 (AttributeError) for good.  Now it is reported as corrupt and rebuilt."""
    x = np.ones((1, 1, 4, 4), np.float32)
    args = (np.ones((1, 1, 2, 2), np.float32), x, np.zeros((1, 2, 2, 2), np.float32), 0, 0, False)
    want = aclnn_iree.grid_sampler_2d_backward(*args)[0]
    st = ArtifactStore(isolated)
    m = st.manifest()
    m["artifacts"][ArtifactStore.artifact_id(SPEC, TARGET)] = bad
    Path(isolated, "manifest.json").write_text(json.dumps(m))
    kernels.unload_modules()
    if bad is not None:
        assert st.status(SPEC, TARGET) == "corrupt"
        with pytest.warns(RuntimeWarning, match="malformed"):
            got = aclnn_iree.grid_sampler_2d_backward(*args)[0]
    else:  # a null entry reads as absent: rebuilt silently
        got = aclnn_iree.grid_sampler_2d_backward(*args)[0]
    np.testing.assert_array_equal(got, want)
    assert st.status(SPEC, TARGET) == "ok"


def test_malformed_manifest_file_is_an_empty_store(tmp_path):
    """A malformed manifest makes an empty store, said once per version of the file (it had
    been silent: a store's modules vanished without a word)."""
    for i, text in enumerate(("[]", '{"artifacts": []}', "not json", '"x"')):
        Path(tmp_path, "manifest.json").write_text(text + " " * i)  # each its own size: a new version
        with pytest.warns(RuntimeWarning, match="the store is taken as empty"):
            assert ArtifactStore(tmp_path).manifest() == {"artifacts": {}}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same file again: no second warning
            assert ArtifactStore(tmp_path).status(SPEC, TARGET) == "missing"


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664)], ids=["umask022", "umask002"])
def test_store_files_respect_the_umask(tmp_path, umask, mode):
    """The attack: files were created 0600 whatever the umask (mkstemp), so a store built by
    one user read as "no valid artifact" for another."""
    old = os.umask(umask)
    try:
        st = ArtifactStore(tmp_path / "store")
        st.build_one(SPEC, TARGET)
    finally:
        os.umask(old)
    for f in [*st.paths(SPEC, TARGET).values(), os.path.join(st.root, "manifest.json")]:
        assert os.stat(f).st_mode & 0o777 == mode, f


_READ_AS_ANOTHER_USER = """
    import os, sys, warnings
    from aclnn_iree.compiler import GridSamplerSpec, get_target
    from aclnn_iree.compiler.build import ArtifactStore
    from aclnn_iree.compiler.key import artifact_key
    from aclnn_iree.runtime import store
    spec, target = GridSamplerSpec("bilinear", "zeros", False, "float32"), get_target("llvm-cpu")
    artifact_key(spec, target)  # the CPU fingerprint and compiler version, while the stdlib is readable
    if os.getuid() == 0:  # as root, read as nobody (root reads any file)
        os.setgid(65534); os.setuid(65534)
    st = ArtifactStore(sys.argv[1])
    data, state, problem = st.find(spec, target)
    print(state, "|", problem)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert st.lookup(spec, target) is None
    print("WARN", w[0].message)
    store.set_offline(True)
    store.set_artifacts_dir(sys.argv[1])
    store.PROJECT_ARTIFACTS = store.PROJECT_ARTIFACTS.parent / "no-such-artifacts"
    try:
        store.load_module_bytes(spec, "local-task")
    except store.ArtifactMissing as e:
        print("MISSING", e)
"""


def test_an_unreadable_artifact_says_so():
    """The attack: a store another user could not read said "no valid artifact ... Run
    aclnn-iree build".  Now the path and EACCES are named (found, not missing)."""
    import tempfile
    shared = Path(tempfile.mkdtemp(prefix="aclnn-iree-shared-", dir="/tmp"))  # others may enter /tmp
    try:
        os.chmod(shared, 0o755)
        old = os.umask(0o022)
        try:
            st = ArtifactStore(shared / "store")
            st.build_one(SPEC, TARGET)
        finally:
            os.umask(old)
        vmfb = st.paths(SPEC, TARGET)["vmfb"]
        os.chmod(vmfb, 0o000 if os.getuid() != 0 else 0o600)
        cache = shared / "cache"
        cache.mkdir()
        os.chmod(cache, 0o777)
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(_READ_AS_ANOTHER_USER), st.root], text=True,
                           capture_output=True, timeout=300, env={**os.environ, "ACLNN_IREE_CACHE": str(cache)})
    finally:
        for root, dirs, files in os.walk(shared):
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        shutil.rmtree(shared, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert out.startswith("unreadable |"), out
    assert f"cannot read {vmfb}" in out and "EACCES" in out and "Permission denied" in out
    assert f"WARN artifact {vmfb}: cannot read" in out
    assert "MISSING" in out and f"{vmfb} (cannot read {vmfb}: [Errno 13] EACCES" in out


def test_stale_temporaries_are_removed_and_live_ones_kept(tmp_path):
    """A writer killed mid-write leaves `.tmp-<host>-<pid>-...`: the next write into the
    folder removes those of dead processes on this host and any over a day old."""
    st = ArtifactStore(tmp_path / "store")
    folder = Path(st.paths(SPEC, TARGET)["vmfb"]).parent
    folder.mkdir(parents=True)
    host = socket.gethostname().replace("-", "_")[:40]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {"dead": f".tmp-{host}-{dead.pid}-0000-{SPEC.kernel_name}.vmfb",
             "live": f".tmp-{host}-{os.getpid()}-0000-{SPEC.kernel_name}.mlir",
             "old": f".tmp-otherhost-1-0000-{SPEC.kernel_name}.vmfb",
             "fresh_other_host": f".tmp-otherhost-1-0001-{SPEC.kernel_name}.vmfb"}
    for n in names.values():
        (folder / n).write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 86400
    os.utime(folder / names["old"], (two_days_ago, two_days_ago))
    st.build_one(SPEC, TARGET)
    left = {p.name for p in folder.iterdir() if p.name.startswith(".tmp-")}
    assert left == {names["live"], names["fresh_other_host"]}


def test_a_module_iree_cannot_load_names_its_file(isolated):
    """The attack: a corrupt vmfb whose sha256 and size matched the manifest gave a FlatBuffer error
    that did not name the file.  Now the message (561003) names it and says what to do."""
    st = ArtifactStore(isolated)
    st.build_one(SPEC, TARGET)
    p = st.paths(SPEC, TARGET)["vmfb"]
    junk = b"\x00" * 64 + os.urandom(256)
    Path(p).write_bytes(junk)
    m = st.manifest()
    entry = m["artifacts"][ArtifactStore.artifact_id(SPEC, TARGET)]
    entry["vmfb_sha256"], entry["vmfb_bytes"] = hashlib.sha256(junk).hexdigest(), len(junk)
    Path(isolated, "manifest.json").write_text(json.dumps(m))
    x = np.ones((1, 1, 4, 4), np.float32)
    with pytest.raises(AclnnError) as ei:
        aclnn_iree.grid_sampler_2d_backward(np.ones((1, 1, 2, 2), np.float32), x, np.zeros((1, 2, 2, 2), np.float32),
                                            0, 0, False)
    assert ei.value.status == ACLNN_ERR_INNER_FIND_KERNEL_ERROR
    assert p in str(ei.value) and "cannot load module" in str(ei.value)


# ----------------------------------------------------------------------------------------
# Shared template partials: the key is the rendered MLIR, so editing a macro of
# templates/_common.mlir.j2 rebuilds exactly the modules whose text it changes.
# ----------------------------------------------------------------------------------------
ALL_TARGETS = ("llvm-cpu", "vulkan-spirv", "cuda")


def _templates_with_edited_macro(tmp_path, monkeypatch, macro: str, line: str):
    """Renders from a copy of the templates in which `line` opens `macro`'s output in the
    shared partial (the installed templates stay as they are)."""
    import importlib
    import shutil
    from importlib import resources

    import jinja2
    render_mod = importlib.import_module("aclnn_iree.compiler.render")  # the module, not the function
    tdir = tmp_path / "templates"
    # every family's folder with it
    shutil.copytree(str(resources.files("aclnn_iree.templates")), tdir,
                    ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    common = tdir / "_common.mlir.j2"
    text = common.read_text()
    head = re.search(r"\{%%- macro %s\(.*?%%\}\n" % macro, text)
    assert head, f"no macro {macro} in the shared partial"
    common.write_text(text[:head.end()] + line + "\n" + text[head.end():])
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(tdir)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    monkeypatch.setattr(render_mod, "_environment", lambda: env)


def _all_keys():
    from aclnn_iree.compiler.key import artifact_key
    from aclnn_iree.compiler.specs import all_specs
    return {(t, s.kernel_name): artifact_key(s, get_target(t), compiler="3.13-test")
            for t in ALL_TARGETS for s in all_specs()}


@pytest.mark.parametrize("macro,line,expect", [
    # Every GPU form loops grid-stride; no CPU form does.
    ("gpu_loop", "      // edited", lambda t, name: t != "llvm-cpu"),
    # Capped CPU counts: every upsample module's (forward and backward), every grid sampler
    # forward's and the grid sampler backward's grad_grid passes (bilinear and bicubic; nearest
    # has none); no GPU form has any.
    ("count_capped", "    // edited",
     lambda t, name: t == "llvm-cpu" and (name.startswith("upsample") or not name.startswith("grid_sampler_2d_backward")
                                          or "_nearest_" not in name)),
])
def test_editing_a_shared_partial_rebuilds_exactly_the_modules_it_changes(tmp_path, monkeypatch, macro, line,
                                                                           expect):
    before = _all_keys()
    _templates_with_edited_macro(tmp_path, monkeypatch, macro, line)
    after = _all_keys()
    changed = {k for k in before if before[k] != after[k]}
    expected = {(t, name) for t, name in before if expect(t, name)}
    assert changed == expected
    assert 0 < len(changed) < len(before)


def test_a_store_rebuilds_the_module_a_partial_edit_changes_and_keeps_the_other(tmp_path, monkeypatch):
    up, nearest = UpsampleSpec(False, "float32", "NCHW"), GridSamplerSpec("nearest", "zeros", False, "float32")
    st = ArtifactStore(str(tmp_path / "store"))
    assert st.build([up, nearest], [TARGET], progress=False).failed == []
    _templates_with_edited_macro(tmp_path, monkeypatch, "count_capped", "    // edited")
    assert st.status(up, TARGET) == "stale"
    assert st.status(nearest, TARGET) == "ok"
    with pytest.warns(RuntimeWarning, match="stale"):
        result = st.build([up, nearest], [TARGET], progress=False)
    assert (result.compiled, result.reused) == (1, 1)
    assert "// edited" in Path(st.paths(up, TARGET)["mlir"]).read_text()


# ----------------------------------------------------------------------------------------
# store.prepare: what first use would compile one at a time, compiled at once
# ----------------------------------------------------------------------------------------
def test_prepare_compiles_what_no_searched_directory_holds_into_the_cache(isolated, tmp_path, monkeypatch):
    a, b = UpsampleSpec(False, "float32", "NCHW"), GridSamplerSpec("nearest", "zeros", False, "float32")
    shipped = tmp_path / "shipped"
    assert ArtifactStore(str(shipped)).build([a], [TARGET], progress=False).compiled == 1
    monkeypatch.setenv("ACLNN_IREE_ARTIFACTS", str(shipped))
    first = store.prepare([a, b], "local-task", jobs=2)
    assert (first.compiled, first.reused, first.failed) == (1, 1, [])
    cache = ArtifactStore(str(isolated))
    assert cache.status(b, TARGET) == "ok" and cache.status(a, TARGET) == "missing"  # a came shipped
    again = store.prepare([a, b, b], "local-task")  # a spec named twice is one module
    assert (again.compiled, again.reused) == (0, 2)
    with pytest.raises(ValueError, match="jobs"):
        store.prepare([a], "local-task", jobs=0)
    with pytest.raises(TypeError, match="device_name"):
        store.prepare([a], None)
    # Offline, a missing module is an error naming the count and the build command.
    c = GridSamplerSpec("nearest", "border", False, "float32")
    monkeypatch.setenv("ACLNN_IREE_OFFLINE", "1")
    with pytest.raises(store.ArtifactMissing, match=r"offline mode: 1 of 3 modules .*: "
                       + c.kernel_name + r"; build them: `aclnn-iree build --target llvm-cpu --kernel "
                       + c.kernel_name + "`"):
        store.prepare([a, b, c], "local-task")
    assert cache.status(c, TARGET) == "missing"


# ----------------------------------------------------------------------------- hostile store files
def _built_store(root) -> ArtifactStore:
    st = ArtifactStore(root)
    st.build_one(SPEC, TARGET)
    return st


@pytest.mark.parametrize("which", ["vmfb", "manifest"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "too_large"])
def test_a_store_file_that_is_not_its_regular_file_is_skipped(tmp_path, which, kind):
    """The attack: a FIFO in place of a vmfb (its manifest entry kept) or of manifest.json
    blocked every call for good; a symlink to /dev/zero was read until memory ran out.  Now
    only regular files are read, never past the recorded size (the manifest: 64 MiB), and
    anything else is "unreadable" with the reason, as an unreadable file is."""
    st = _built_store(tmp_path / "store")
    path = st.paths(SPEC, TARGET)["vmfb"] if which == "vmfb" else os.path.join(st.root, "manifest.json")
    size = os.path.getsize(path)
    if kind != "too_large":
        os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        os.mkdir(path)
    else:
        with open(path, "ab") as f:
            f.truncate((64 << 20) + 1 if which == "manifest" else size + 1)
    t0 = time.monotonic()
    data, state, problem = st.find(SPEC, TARGET)
    assert time.monotonic() - t0 < 10 and data is None, (state, problem)
    if kind == "too_large" and which == "vmfb":  # a regular file of another size than recorded: not read
        assert state == "corrupt" and f"the manifest records {size}" in problem, (state, problem)
        return
    assert state == "unreadable", (state, problem)
    want = {"fifo": "not a regular file", "dev_zero": "not a regular file", "directory": "not a regular file",
            "too_large": "expected"}[kind]
    assert want in problem and "cannot read" in problem, problem


def test_a_huge_recorded_size_is_not_read(tmp_path):
    """The attack: a 3 GiB sparse vmfb whose manifest entry records 10**12 bytes was read whole
    (18 s, 3.2 GiB).  A recorded size over 256 MiB is corrupt, and nothing is read."""
    st = _built_store(tmp_path / "store")
    path = st.paths(SPEC, TARGET)["vmfb"]
    with open(path, "ab") as f:
        f.truncate(3 << 30)
    m = json.loads(Path(st.root, "manifest.json").read_text())
    m["artifacts"][ArtifactStore.artifact_id(SPEC, TARGET)]["vmfb_bytes"] = 10 ** 12
    Path(st.root, "manifest.json").write_text(json.dumps(m))
    t0 = time.monotonic()
    data, state, problem = st.find(SPEC, TARGET)
    assert time.monotonic() - t0 < 5 and data is None and state == "corrupt" and "vmfb_bytes" in problem


def test_a_manifest_nested_too_deep_to_parse_is_an_empty_store(tmp_path):
    """The attack: "[" * 200000 + "]" * 200000 as manifest.json raised RecursionError (561000)
    in every call instead of skipping the store."""
    st = _built_store(tmp_path / "store")
    Path(st.root, "manifest.json").write_text("[" * 200000 + "]" * 200000)
    with pytest.warns(RuntimeWarning, match="not JSON"):
        assert st.manifest() == {"artifacts": {}} and st.status(SPEC, TARGET) == "missing"


def test_another_kernels_module_under_a_forged_entry_names_its_file(isolated):
    """The attack: a vmfb replaced by another kernel's module, its sha256 and size forged in the
    manifest, gave 561000 LookupError without the path; it is 561003 naming the file."""
    st = ArtifactStore(isolated)
    other = UpsampleSpec(False, "float32", "NCHW")
    st.build_one(SPEC, TARGET)
    data, _ = st.build_one(other, TARGET)
    path = st.paths(SPEC, TARGET)["vmfb"]
    Path(path).write_bytes(data)
    m = st.manifest()
    e = m["artifacts"][ArtifactStore.artifact_id(SPEC, TARGET)]
    e["vmfb_sha256"], e["vmfb_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    Path(st.root, "manifest.json").write_text(json.dumps(m))
    with pytest.raises(AclnnError) as err:
        aclnn_iree.grid_sampler_2d_backward(np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 3, 3), np.float32),
                                            np.zeros((1, 2, 2, 2), np.float32))
    assert err.value.status == ACLNN_ERR_INNER_FIND_KERNEL_ERROR and path in str(err.value), str(err.value)


def test_a_call_with_a_fifo_in_the_store_goes_on_to_the_next_directory(tmp_path):
    """End to end, in a child (a hang fails the test, not the run): ACLNN_IREE_ARTIFACTS
    names a store whose vmfb and manifest are FIFOs; the call warns and uses the cache."""
    st = _built_store(tmp_path / "store")
    cache = tmp_path / "cache"
    shutil.copytree(st.root, cache)
    for p in (st.paths(SPEC, TARGET)["vmfb"], os.path.join(st.root, "manifest.json")):
        os.unlink(p)
        os.mkfifo(p)
    code = textwrap.dedent(_HIDE) + textwrap.dedent("""
        import warnings
        import numpy as np
        import aclnn_iree
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            dx, dg = aclnn_iree.grid_sampler_2d_backward(np.ones((1, 1, 2, 2), np.float32),
                                                         np.ones((1, 1, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32))
        assert dx.sum() == 4.0
        print("|".join(str(x.message) for x in w))
    """)
    env = {**_child_env(cache, offline=True), "ACLNN_IREE_ARTIFACTS": st.root}
    out, = _wait_all([_child(code, env)], timeout=120)
    assert "not a regular file" in out, out


def test_cpu_arch_variable_cannot_name_a_path(isolated, tmp_path, monkeypatch):
    """The attack: ACLNN_IREE_CPU_ARCH=../../../escape wrote .mlir and .vmfb.lock outside the
    cache.  It is checked as the CLI's --target-cpu is: a clear 561003, nothing written."""
    monkeypatch.setenv("ACLNN_IREE_CPU_ARCH", "../../../escape")
    before = set(tmp_path.rglob("*"))
    with pytest.raises(AclnnError) as e:
        aclnn_iree.upsample_bilinear2d_backward(np.ones((1, 1, 4, 4), np.float32), (4, 4), (1, 1, 2, 2))
    assert e.value.status == ACLNN_ERR_INNER_FIND_KERNEL_ERROR
    assert "ACLNN_IREE_CPU_ARCH='../../../escape' is not an LLVM CPU name" in str(e.value)
    with pytest.raises(AclnnError):
        aclnn_iree.grid_sampler_2d_backward(np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 3, 3), np.float32),
                                            np.zeros((1, 2, 2, 2), np.float32))
    assert set(tmp_path.rglob("*")) == before and not (tmp_path.parent.parent / "escape.mlir").exists()


def test_modules_for_a_cpu_this_one_cannot_run_are_refused(isolated, monkeypatch):
    """The attack: ACLNN_IREE_CPU_ARCH=sapphirerapids on a CPU without AVX512-FP16, then a
    float16 upsample: SIGILL.  The manifest records the features a named CPU's modules use,
    and a CPU without one of them (as iree-cpuinfo says) gets 561003 naming both CPUs.
    (This machine may have them all: its feature table is replaced by one that lacks two.)"""
    monkeypatch.setenv("ACLNN_IREE_CPU_ARCH", "sapphirerapids")
    spec = UpsampleSpec(False, "float16", "NCHW")
    target = get_target("llvm-cpu", "sapphirerapids")
    ArtifactStore(isolated).build_one(spec, target)
    entry = ArtifactStore(isolated).manifest()["artifacts"][ArtifactStore.artifact_id(spec, target)]
    assert {"+avx512fp16", "+avx512f", "+amx-tile"} <= set(entry["cpu_features"])
    table = {f: True for f in ("sse4.1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw")}
    table.update({"avx512fp16": False, "amx-tile": False})
    monkeypatch.setattr(store, "host_feature_table", lambda: table)
    with pytest.raises(AclnnError) as e:
        aclnn_iree.upsample_bilinear2d_backward(np.ones((1, 1, 4, 4), np.float16), (4, 4), (1, 1, 2, 2))
    msg = str(e.value)
    assert e.value.status == ACLNN_ERR_INNER_FIND_KERNEL_ERROR
    assert "'sapphirerapids'" in msg and "amx-tile, avx512fp16" in msg and "this CPU (" in msg, msg
    table["avx512fp16"] = table["amx-tile"] = True  # a CPU that has them runs them
    kernels.unload_modules()
    out = aclnn_iree.upsample_bilinear2d_backward(np.ones((1, 1, 4, 4), np.float16), (4, 4), (1, 1, 2, 2))
    assert float(out.astype(np.float32).sum()) == 16.0


def test_a_store_writable_by_everyone_warns_once(isolated, tmp_path, monkeypatch):
    st = _built_store(tmp_path / "shared")
    os.chmod(st.root, 0o777)
    monkeypatch.setenv("ACLNN_IREE_ARTIFACTS", st.root)
    monkeypatch.setattr(store, "_warned_writable", set())
    args = (np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 3, 3), np.float32), np.zeros((1, 2, 2, 2), np.float32))
    with pytest.warns(RuntimeWarning, match="writable by every user") as w:
        aclnn_iree.grid_sampler_2d_backward(*args)
        kernels.unload_modules()
        aclnn_iree.grid_sampler_2d_backward(*args)
    assert sum("writable by every user" in str(x.message) for x in w) == 1


def test_lock_files_take_the_stores_permissions(tmp_path):
    """The attack: lock files were created 0666 whatever the store's own mode."""
    root = tmp_path / "store"
    root.mkdir()
    os.chmod(root, 0o750)
    old = os.umask(0)
    try:
        st = ArtifactStore(root)
        st.build_one(SPEC, TARGET)
        with st.compile_lock(SPEC, TARGET):
            pass
    finally:
        os.umask(old)
    locks = [p for p in root.rglob("*.lock")]
    assert len(locks) >= 2 and all(os.stat(p).st_mode & 0o777 == 0o640 for p in locks), \
        [(str(p), oct(os.stat(p).st_mode)) for p in locks]


# ----------------------------------------------------------------------------- compile on first use (issue 47)
class _Records(logging.Handler):
    """Keeps every record it is given (caplog belongs to pytest's logging plugin, which
    `-p no:logging` leaves out)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def first_use_log(monkeypatch):
    """The records of the "aclnn_iree" loggers at INFO and above during the test, in a process
    that has announced no compile on first use yet."""
    handler, logger = _Records(), logging.getLogger("aclnn_iree")
    monkeypatch.setattr(store, "_announced", set())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _first_use_line(spec, cache) -> str:
    return (f"compiling {spec.kernel_name} for llvm-cpu on first use: a few seconds, once (kept in {cache}); "
            f"`aclnn-iree build --target llvm-cpu` compiles every kernel ahead of time")


def test_a_compile_on_first_use_says_which_and_how_to_build_ahead(isolated, first_use_log, monkeypatch):
    """A first call sat silent for seconds while its kernel compiled: now one log line (WARNING
    for the target's first compile in the process, INFO after) and, on a terminal, a bar
    counting the seconds, which warns of nothing."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, path = store.load_module_bytes(SPEC, "local-task")
    assert path.startswith(str(isolated)) and not caught, [str(w.message) for w in caught]
    (record,) = first_use_log
    assert (record.name, record.levelno) == ("aclnn_iree.runtime.store", logging.WARNING)
    assert record.getMessage() == _first_use_line(SPEC, isolated)
    shown = terminal.getvalue()
    assert f"compiling {SPEC.kernel_name} for llvm-cpu (00:" in shown, shown
    assert shown.split("\r")[-1].strip() == "", shown  # cleared when the compile is done

    store.load_module_bytes(SPEC, "local-task")  # in the cache now: nothing to say
    assert len(first_use_log) == 1
    other = GridSamplerSpec("nearest", "zeros", False, "float32")
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: no bar
    store.load_module_bytes(other, "local-task")
    assert [r.levelno for r in first_use_log] == [logging.WARNING, logging.INFO]
    assert first_use_log[1].getMessage() == _first_use_line(other, isolated) and sys.stderr.getvalue() == ""


def test_without_logging_set_up_a_compile_on_first_use_prints_its_line_alone(tmp_path):
    """What a user sees who set up no logging, stderr not a terminal: the one WARNING line
    (Python's last-resort handler), no bar, nothing else."""
    cache = tmp_path / "cache"
    cache.mkdir()
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_HIDE) + textwrap.dedent("""
        from aclnn_iree.compiler import GridSamplerSpec
        store.load_module_bytes(GridSamplerSpec("bilinear", "zeros", False, "float32"), "local-task")
        print("OK")
    """)], env={**os.environ, **_child_env(cache)}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout == "OK\n", p.stdout + p.stderr
    assert p.stderr.splitlines() == [_first_use_line(SPEC, cache)], p.stderr
