"""Artifact store: compiled modules on disk, their manifest, and the parallel ahead-of-time build.

The key (key.py), module reflection (reflect.py) and shared-file handling (files.py) are
modules of their own.

Layout of a store directory (one vmfb per specialisation and target, see
docs/build.md):

    <dir>/<target>/<kernel_name>.vmfb    the module
    <dir>/<target>/<kernel_name>.mlir    its rendered source
    <dir>/<target>/<kernel_name>.cmd     the exact iree-compile command
    <dir>/manifest.json                  one entry per artifact

An artifact is valid only when its cache key (the sha256 of the rendered MLIR,
the compile flags, the IREE compiler version, and this CPU for "host" builds) and
the sha256 of its vmfb match the manifest; anything else is reported and rebuilt,
never loaded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import stat
import threading
import time
import warnings

import filelock

from .compile import compile_file, compiler_build, compiler_version, require_compiler, target_cpu_features
from .files import atomic_write, os_error_text, read_regular, remove_stale_temporaries
from .key import artifact_key, host_cpu, sha256_hex
from .reflect import module_exports, ptxas_report
from .render import render, template_files

__all__ = ["ArtifactStore", "BuildResult", "buildable_pairs", "calls_record", "target_folder"]

MANIFEST = "manifest.json"
# A manifest of every module of every target is about 1 MiB; anything past this is not one.
MANIFEST_MAX_BYTES = 64 << 20
# Modules are 8-100 KiB; a manifest entry recording more than this is not one of ours.
VMFB_MAX_BYTES = 256 << 20
_manifest_cache: dict = {}  # manifest path -> ((path, inode, mtime_ns, size), parsed manifest)
_manifest_lock = threading.Lock()
_process_locks: dict = {}  # store root -> threading.Lock (one writer thread per store and process)


def _process_lock(root: str) -> threading.Lock:
    with _manifest_lock:
        return _process_locks.setdefault(root, threading.Lock())


_malformed_seen: set = set()


def _malformed_manifest(path: str, why: str):
    """Warns, once per process and version of the file, that the manifest at `path` is
    malformed and its store is taken as empty (its modules are not loaded; a build into the
    store rewrites the manifest with what it builds)."""
    try:
        st = os.stat(path)
        seen = (path, st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        seen = (path,)
    if seen in _malformed_seen:
        return
    _malformed_seen.add(seen)
    warnings.warn(f"{path} is {why}: the store is taken as empty (its modules are not loaded; a build into it "
                  "rewrites the manifest)", RuntimeWarning, stacklevel=4)


def _workspace_bytes(name, constant) -> int:
    """A module's constant workspace size (its reflection's decimal string) as bytes; raises
    ValueError for anything but a decimal count below 2^63 (an i64, as the companion returns)."""
    text = str(constant)
    if not text.isascii() or not text.isdigit() or int(text) >= 1 << 63:
        raise ValueError(f"the constant workspace size of {name} is {constant!r}, not a byte count")
    return int(text)


def calls_record(spec, target, exports: dict) -> dict:
    """A module's manifest "calls" record (docs/embedding.md): the spec's rules and function
    arguments (spec.calls) with each function's workspace from the module's reflection
    (`exports`, reflect.module_exports): "bytes", the size when the module declares it
    constant (`iree.abi.transients.size.constant`), else None; and "size_function", the
    `_transients_size` companion that returns it (i64) for the function's own arguments,
    of which it reads only the tensors' shapes (and the device): the workspace and the
    fences may be null (`(null)` in iree-run-module)."""
    calls = spec.calls(target)
    for name, function in calls["functions"].items():
        export = exports.get(name) or {}
        constant = export.get("transients_size_constant")
        size_name = export.get("transients_size_function") or name + "_transients_size"
        if not isinstance(size_name, str):
            raise TypeError(f"the transients size function of {name} is {size_name!r}, not a name")
        function["workspace"] = {
            "bytes": _workspace_bytes(name, constant) if constant is not None else None,
            "size_function": {"name": size_name, "arguments": [a["name"] for a in function["arguments"]],
                              "null_arguments": ["workspace", "wait_fence", "signal_fence"], "result": "i64"}
            if size_name in exports else None}
    return calls


def target_folder(target) -> str:
    """The store folder of a target: its name, plus the CPU for an llvm-cpu build for a
    named CPU (`llvm-cpu-x86-64-v3`) or the GPU architecture of a GPU build for a named
    one (`vulkan-spirv-ampere`), so such builds never replace the default ones."""
    from .targets import TARGETS
    if target.name == "llvm-cpu" and target.arch != TARGETS["llvm-cpu"].arch:
        return f"llvm-cpu-{target.arch}"
    if target.name != "llvm-cpu" and target.arch != TARGETS[target.name].arch:
        return f"{target.name}-{target.arch}"  # a named GPU architecture (--gpu-arch)
    return target.name


@dataclasses.dataclass
class BuildResult:
    """Outcome of one build: counts, failures as (kernel_name, target, message), seconds, and
    CUDA kernels that ptxas says spill registers, as (kernel_name, function, spill bytes)."""

    compiled: int = 0
    reused: int = 0
    failed: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    spills: list = dataclasses.field(default_factory=list)


def buildable_pairs(specs, targets) -> list:
    """The (specialisation, target) pairs that building `specs` for `targets` compiles: each
    spec as the target takes it (KernelSpec.for_target: the linalg form where the target has no
    tuned forms), without the dtypes a target cannot compute, each pair once."""
    pairs = (((s.for_target(t), t) for s in specs) for t in targets)
    return list(dict.fromkeys((s, t) for group in pairs for s, t in group if s is not None))


class ArtifactStore:
    """A directory of compiled modules with a manifest.

    Safe for threads and for processes sharing the directory: every read-modify-write of
    the manifest holds an inter-process lock (a lock file beside it) and re-reads the
    manifest under it; every file is replaced atomically, so readers need no lock.
    """

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))

    # -- manifest --------------------------------------------------------------
    def manifest(self) -> dict:
        """The manifest ({"artifacts": {id: entry}}); empty when absent or malformed.

        A fresh copy each call: callers may change it.  Raises OSError when the file
        exists but cannot be read (EACCES), or is not a regular file of at most
        MANIFEST_MAX_BYTES (files.read_regular: a FIFO or /dev/zero in its place never
        blocks or exhausts memory).
        """
        path = os.path.join(self.root, MANIFEST)
        try:
            m = json.loads(read_regular(path, MANIFEST_MAX_BYTES))
        except FileNotFoundError:
            return {"artifacts": {}}
        except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than json parses
            _malformed_manifest(path, f"not JSON ({type(e).__name__})")
            return {"artifacts": {}}
        if not isinstance(m, dict) or not isinstance(m.get("artifacts"), dict):
            _malformed_manifest(path, 'not an object with an "artifacts" object')
            return {"artifacts": {}}
        return m

    def _entry(self, spec, target):
        """One artifact's manifest entry as it is on disk (possibly malformed: not a dict),
        parsing the manifest only when the file changed (it is re-read on every lookup
        otherwise: ~5 ms for all artifacts).  None when absent; OSError when unreadable."""
        path = os.path.join(self.root, MANIFEST)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        key = (path, st.st_ino, st.st_mtime_ns, st.st_size)  # os.replace gives a new inode
        with _manifest_lock:
            cached = _manifest_cache.get(path)
        if cached is None or cached[0] != key:
            cached = (key, self.manifest())
            with _manifest_lock:
                _manifest_cache[path] = cached
        return cached[1]["artifacts"].get(self.artifact_id(spec, target))

    def lock(self) -> filelock.FileLock:
        """The store's inter-process lock (also exclusive between threads)."""
        os.makedirs(self.root, exist_ok=True)
        return filelock.FileLock(os.path.join(self.root, MANIFEST + ".lock"), thread_local=False,
                                 mode=self._lock_mode())

    def compile_lock(self, spec, target) -> filelock.FileLock:
        """The inter-process lock of one artifact's compile (`<kernel>.vmfb.lock` beside it):
        a process that finds the module missing compiles it under this lock, and one that
        waited on it looks again first, so two processes (DDP ranks on first use, two builds)
        compile each module once, not once each.  Separate objects block each other in one
        process too (each holds its own descriptor)."""
        path = self.paths(spec, target)["vmfb"] + ".lock"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return filelock.FileLock(path, thread_local=False, mode=self._lock_mode())

    def _lock_mode(self) -> int:
        """Lock files take the store's own permissions (its directory's read and write bits):
        writable by whoever may write the store, and by nobody else.  The owner always reads
        and writes its own lock (filelock refuses a lock file mode without both; root may
        write into a store whose directory lacks the owner's write bit)."""
        try:
            return stat.S_IMODE(os.stat(self.root).st_mode) & 0o666 | 0o600
        except OSError:
            return 0o644

    def _update_manifest(self, entries: dict):
        """Adds `entries` to the manifest: under the store's lock, re-reading it first, so that
        concurrent writers (threads or processes) never drop each other's entries."""
        with _process_lock(self.root), self.lock():
            remove_stale_temporaries(self.root)
            m = self.manifest()
            m["artifacts"].update(entries)
            m["compiler_version"] = compiler_version()
            atomic_write(os.path.join(self.root, MANIFEST), json.dumps(m, indent=1, sort_keys=True).encode())

    def _refresh_calls(self, pairs):
        """Brings the "calls" record (calls_record) of valid artifacts up to date without
        compiling: it depends on the specialisation and the module's recorded exports only, so
        a module built before the record existed, or before its rules changed, gets it from
        the next `build`.  Writes the manifest only when a record differs, and only into the
        entry it was computed from (the same key), under the store's lock."""
        updates = {}
        for spec, target in pairs:
            entry = self._entry(spec, target)
            if isinstance(entry, dict) and isinstance(entry.get("exports"), dict):
                try:
                    calls = calls_record(spec, target, entry["exports"])
                except (TypeError, ValueError, AttributeError, OverflowError, KeyError) as e:
                    # a tampered or damaged "exports" whose key and sha256 still match: keep the
                    # module, say which entry, leave its record as it is
                    warnings.warn(f"{os.path.join(self.root, MANIFEST)}: the entry of {self.artifact_id(spec, target)} "
                                  f"has malformed \"exports\" ({type(e).__name__}: {e}); its \"calls\" record is not "
                                  "updated (delete the entry to rebuild it)", RuntimeWarning, stacklevel=3)
                    continue
                if entry.get("calls") != calls:
                    updates[self.artifact_id(spec, target)] = (entry.get("key"), calls)
        if not updates:
            return
        try:
            with _process_lock(self.root), self.lock():
                m = self.manifest()
                changed = False
                for aid, (key, calls) in updates.items():
                    entry = m["artifacts"].get(aid)
                    if isinstance(entry, dict) and entry.get("key") == key:
                        entry["calls"] = calls
                        changed = True
                if changed:
                    atomic_write(os.path.join(self.root, MANIFEST), json.dumps(m, indent=1, sort_keys=True).encode())
        except OSError as e:  # a store this user may read but not write: its modules still load
            warnings.warn(f"cannot add the \"calls\" records to {os.path.join(self.root, MANIFEST)}: "
                          f"{os_error_text(e)}", RuntimeWarning, stacklevel=3)

    @staticmethod
    def artifact_id(spec, target) -> str:
        return f"{target_folder(target)}/{spec.kernel_name}"

    def paths(self, spec, target) -> dict:
        base = os.path.join(self.root, target_folder(target), spec.kernel_name)
        return {"vmfb": base + ".vmfb", "mlir": base + ".mlir", "cmd": base + ".cmd"}

    # -- lookup ----------------------------------------------------------------
    def find(self, spec, target) -> tuple:
        """(vmfb bytes or None, state, problem): state is "ok", "missing", "stale", "corrupt"
        or "unreadable"; problem says why it is not "ok" ("" when missing)."""
        path = self.paths(spec, target)["vmfb"]
        try:
            entry = self._entry(spec, target)
        except OSError as e:
            return None, "unreadable", f"cannot read {os.path.join(self.root, MANIFEST)}: {os_error_text(e)}"
        if entry is None or not os.path.exists(path):
            return None, "missing", ""
        if not isinstance(entry, dict):
            return None, "corrupt", f"its manifest entry is malformed ({type(entry).__name__}, not an object)"
        # Without a compiler here (a runtime-only install) the module's own compiler version
        # is taken as given: the source, flags and CPU must still match.
        if entry.get("key") != artifact_key(spec, target, render(spec, target), compiler=compiler_version() or
                                            str(entry.get("compiler_version"))):
            return None, "stale", "stale (rendered source, flags, compiler version or host CPU changed)"
        size = entry.get("vmfb_bytes")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= VMFB_MAX_BYTES:
            return None, "corrupt", f"its manifest entry records no size (vmfb_bytes) of 1 to {VMFB_MAX_BYTES} bytes"
        try:
            st = os.stat(path)
        except OSError as e:
            return None, "unreadable", f"cannot read {path}: {os_error_text(e)}"
        if stat.S_ISREG(st.st_mode) and st.st_size != size:  # not read at all (a huge sparse file, say)
            return None, "corrupt", f"corrupt ({st.st_size} bytes, the manifest records {size})"
        try:  # a regular file of the recorded size only (files.read_regular)
            data = read_regular(path, size)
        except OSError as e:
            return None, "unreadable", f"cannot read {path}: {os_error_text(e)}"
        if sha256_hex(data) != entry.get("vmfb_sha256"):
            return None, "corrupt", "corrupt (sha256 of the vmfb does not match the manifest)"
        return data, "ok", ""

    def lookup(self, spec, target, warn: bool = True):
        """The vmfb bytes of a valid artifact, or None.

        Missing artifacts return None silently; a stale, corrupt (sha256 or manifest entry)
        or unreadable one returns None with a warning that names the file and the reason.
        """
        data, state, problem = self.find(spec, target)
        if state not in ("ok", "missing") and warn:
            path = self.paths(spec, target)["vmfb"]
            then = ("it is skipped" if state == "unreadable" else
                    "it is not loaded (the next build into this store rebuilds it)")
            warnings.warn(f"artifact {path}: {problem}; {then}", RuntimeWarning, stacklevel=3)
        return data

    def status(self, spec, target) -> str:
        """"ok", "missing", "stale", "corrupt" or "unreadable": what lookup() would find,
        without warning."""
        return self.find(spec, target)[1]

    # -- build -----------------------------------------------------------------
    def build_one(self, spec, target) -> tuple:
        """Compiles `spec` for `target` into the store; returns (vmfb bytes, manifest entry).

        The source is written to its place in the store first and compiled there, so the
        recorded command (`.cmd`, the manifest's "command") is exactly what ran, and the
        module's bytes depend on the source, flags and compiler only.
        Raises aclnn_iree.compiler.CompileError when iree-compile fails.
        """
        source = render(spec, target)
        p = self.paths(spec, target)
        remove_stale_temporaries(os.path.dirname(p["vmfb"]))
        atomic_write(p["mlir"], source.encode())
        t0 = time.perf_counter()
        vmfb, cmd, cwd = compile_file(p["mlir"], spec.compile_flags(target))
        compile_seconds = time.perf_counter() - t0
        atomic_write(p["cmd"], (f"cd {shlex.quote(cwd)} && {shlex.join(cmd)} > "
                                 f"{shlex.quote(os.path.basename(p['vmfb']))}\n").encode())
        atomic_write(p["vmfb"], vmfb)
        functions, exports = module_exports(vmfb, spec.function_names(target))
        templates = {name: sha256_hex(text.encode()) for name, text in template_files(spec).items()}
        entry = {
            "op": spec.op,
            "kernel_name": spec.kernel_name,
            "specialisation": {k: v for k, v in dataclasses.asdict(spec).items()},
            "template": spec.template,
            # every file the module was rendered from (root and partials), and one hash of them all
            "template_files": templates,
            "template_sha256": sha256_hex(json.dumps(templates, sort_keys=True).encode()),
            "template_params": spec.template_params(target),
            "functions": functions,
            "exports": exports,
            # which function a call takes and its arguments, for hosts without this package
            "calls": calls_record(spec, target, exports),
            "target": target.name,
            "target_arch": target.arch,
            "driver": target.driver,
            "flags": list(spec.compile_flags(target)),
            "command": cmd,
            "command_cwd": cwd,
            "compiler_version": compiler_version(),
            "compiler_build": compiler_build(),
            "key": artifact_key(spec, target, source),
            "source_sha256": sha256_hex(source.encode()),
            "vmfb_sha256": sha256_hex(vmfb),
            "vmfb_bytes": len(vmfb),
            "files": {k: os.path.relpath(v, self.root) for k, v in p.items()},
            "compile_seconds": round(compile_seconds, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if target.name == "cuda":
            report = ptxas_report(vmfb, target.arch)
            if report is not None:  # where NVIDIA's assembler is installed
                entry["ptxas"] = report
        if target.name == "llvm-cpu":
            entry["target_cpu"] = target.arch
            if target.arch == "host":
                entry["host_cpu"] = host_cpu()
            else:  # what a CPU needs to run it (runtime.store refuses it on one without)
                entry["cpu_features"] = list(target_cpu_features(target.arch))
        self._update_manifest({self.artifact_id(spec, target): entry})
        return vmfb, entry

    def get_or_build(self, spec, target) -> bytes:
        """A valid artifact's bytes, compiling it first when missing, stale or corrupt."""
        data = self.lookup(spec, target)
        if data is None:
            with self.compile_lock(spec, target):
                data = self.lookup(spec, target)  # another process may have built it meanwhile
                if data is None:
                    data, _ = self.build_one(spec, target)
        return data

    def build(self, specs, targets, jobs: int | None = None, progress: bool = True) -> BuildResult:
        """Builds every pair of buildable_pairs(specs, targets) that is not valid already, `jobs`
        compiles at a time.

        A failed compile is recorded in the result and the others go on.
        """
        from concurrent.futures import ThreadPoolExecutor

        from .compile import CompileError

        t0 = time.perf_counter()
        try:  # an unreadable manifest (a FIFO or a directory in its place): say so once, compile nothing
            self.manifest()
        except OSError as e:
            raise OSError(f"{os.path.join(self.root, MANIFEST)}: the store's manifest cannot be read "
                          f"({e.strerror or e}); move it away or build into another directory") from None
        res = BuildResult()
        todo, reused = [], []
        for s, t in buildable_pairs(specs, targets):
            if self.lookup(s, t) is not None:
                res.reused += 1
                reused.append((s, t))
            else:
                todo.append((s, t))
        self._refresh_calls(reused)
        if todo:
            require_compiler()  # say it once, not once per module

        def work(item):
            """(failure or None, manifest entry or None: another process built it meanwhile)."""
            s, t = item
            try:
                with self.compile_lock(s, t):
                    if self.lookup(s, t) is not None:
                        return None, None
                    return None, self.build_one(s, t)[1]
            except CompileError as e:
                return (s.kernel_name, t.name, f"command: {shlex.join(e.command)}\n{e.stderr.strip()}"), None
            except Exception as e:  # a template that does not render, ptxas rejecting PTX: report, go on
                return (s.kernel_name, t.name, f"{type(e).__name__}: {e}"), None

        bar = None
        if progress and todo:
            from tqdm import tqdm
            bar = tqdm(total=len(todo), desc="compiling", unit="module", disable=None)  # none where stderr is no terminal
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as ex:
            for failure, entry in ex.map(work, todo):
                if failure:
                    res.failed.append(failure)
                    continue
                if entry is None:
                    res.reused += 1
                    if bar:
                        bar.update(1)
                    continue
                res.compiled += 1
                ptxas = entry.get("ptxas") or {}
                res.spills += [(entry["kernel_name"], name, ptxas["kernels"][name]["spill_store_bytes"])
                               for name in ptxas.get("spills", [])]
                if bar:
                    bar.update(1)
        if bar:
            bar.close()
        res.seconds = time.perf_counter() - t0
        return res
