"""Artifact store: compiled modules on disk, their manifest, and the ahead-of-time build.

Layout of a store directory (one vmfb per specialisation and target, see README
"Module granularity"):

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
import errno
import hashlib
import json
import os
import platform
import secrets
import shlex
import socket
import subprocess
import threading
import time
import warnings

import filelock

from .compile import compile_file, compiler_version, require_compiler
from .render import render, template_source

__all__ = ["ArtifactStore", "artifact_key", "BuildResult", "host_cpu", "compiler_build", "parse_declaration"]

MANIFEST = "manifest.json"
_manifest_cache: dict = {}  # manifest path -> ((path, inode, mtime_ns, size), parsed manifest)
_manifest_lock = threading.Lock()
_process_locks: dict = {}  # store root -> threading.Lock (one writer thread per store and process)


def _process_lock(root: str) -> threading.Lock:
    with _manifest_lock:
        return _process_locks.setdefault(root, threading.Lock())


def _why(e: OSError) -> str:
    """An OSError as '[Errno 13] EACCES: Permission denied'."""
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"[Errno {e.errno}] {name}: {e.strerror}" if name else str(e)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_host_cpu_cache = None


def host_cpu() -> dict:
    """This machine's CPU as `--iree-llvmcpu-target-cpu=host` sees it: machine, model, features.

    The features are those `iree-cpuinfo` (iree-base-runtime) reports as present,
    or the /proc/cpuinfo flags where that tool is missing.  An artifact built
    for "host" is only valid on a CPU with this fingerprint.
    """
    global _host_cpu_cache
    if _host_cpu_cache is None:
        info = {"machine": platform.machine(), "model": platform.processor() or "", "features": []}
        cpuinfo = {}
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    cpuinfo.setdefault(k.strip(), v.strip())
        except OSError:
            pass
        info["model"] = cpuinfo.get("model name", info["model"])
        try:
            import iree._runtime_libs as libs
            tool = os.path.join(os.path.dirname(libs.__file__), "iree-cpuinfo")
            out = subprocess.run([tool], capture_output=True, text=True, timeout=30, check=True).stdout
            info["features"] = sorted(p[0] for p in (ln.split() for ln in out.splitlines())
                                      if len(p) == 2 and p[1] == "1")
            info["features_from"] = "iree-cpuinfo"
        except Exception:
            info["features"] = sorted(cpuinfo.get("flags", "").split())
            info["features_from"] = "/proc/cpuinfo"
        _host_cpu_cache = info
    return _host_cpu_cache


def artifact_key(spec, target, source: str | None = None, compiler: str | None = None) -> str:
    """Cache key of `spec` compiled for `target`: the sha256 of its rendered MLIR (`source`, rendered
    when not given: what the compiler sees, whatever templates and partials it came from), the
    compile flags and the compiler version (`compiler`, the installed one when not given).

    For the "host" CPU the key also holds the host's CPU fingerprint (host_cpu()):
    a store copied to another machine is then rebuilt instead of loading code for
    instructions that CPU may lack.
    """
    if source is None:
        source = render(spec, target)
    fields = {
        "source_sha256": _sha256(source.encode()),
        "flags": list(target.flags),
        "compiler": compiler or compiler_version(),
    }
    if target.name == "llvm-cpu" and target.arch == "host":
        h = host_cpu()
        fields["host_cpu"] = [h["machine"], h["model"], h["features"]]
    return _sha256(json.dumps(fields, sort_keys=True).encode())


_compiler_build_cache = None


def compiler_build() -> str:
    """The first lines of `iree-compile --version` (exact IREE and LLVM revisions), or "" when unavailable."""
    global _compiler_build_cache
    if _compiler_build_cache is None:
        try:
            from iree.compiler.tools.binaries import find_tool
            out = subprocess.run([find_tool("iree-compile"), "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
            _compiler_build_cache = "; ".join(ln.strip() for ln in out.splitlines()
                                              if ln.strip() and "iree.dev" not in ln)
        except Exception:
            _compiler_build_cache = ""
    return _compiler_build_cache


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


# Temporaries of atomic writes live beside their target, named for their writer so that a
# writer killed mid-write (SIGKILL) leaves something a later build can recognise and remove.
_TMP_PREFIX = ".tmp-"
_STALE_TMP_SECONDS = 24 * 3600


def _tmp_name(path: str) -> str:
    host = socket.gethostname().replace("-", "_")[:40]
    return os.path.join(os.path.dirname(path),
                        f"{_TMP_PREFIX}{host}-{os.getpid()}-{secrets.token_hex(4)}-{os.path.basename(path)}")


def _atomic_write(path: str, data: bytes):
    """Writes `data` to `path` through a temporary file beside it and os.replace (readers
    never see half a file).  The file is created with mode 0666 less the umask, like any
    other file the user writes (mkstemp's 0600 would hide a shared store from other users)."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = _tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temporaries(directory: str) -> list:
    """Removes the temporaries of writers that died (this host, dead pid) or that are over a
    day old (any host: a store on a shared disk); returns the paths removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host = socket.gethostname().replace("-", "_")[:40]
    now = time.time()
    for name in names:
        if not name.startswith(_TMP_PREFIX):
            continue
        path = os.path.join(directory, name)
        parts = name[len(_TMP_PREFIX):].split("-", 2)
        try:
            dead = parts[0] == host and not _pid_alive(int(parts[1]))
            old = now - os.stat(path).st_mtime > _STALE_TMP_SECONDS
            if dead or old:
                os.unlink(path)
                removed.append(path)
        except (ValueError, IndexError, OSError):
            continue
    return removed


def _split_top(text: str, sep: str = ",") -> list:
    """Splits `text` at `sep` outside (), <>, {} and [] (for MLIR argument lists)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<{[":
            depth += 1
        elif ch in ")>}]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _parse_values(text: str) -> list:
    """`%a: T {attrs}, ...` -> [{"name", "type", "attributes"}] (attributes "" when none)."""
    out = []
    for item in _split_top(text):
        name, _, rest = item.partition(":")
        rest = rest.strip()
        attrs = ""
        if rest.endswith("}") and "{" in rest:
            i = rest.index("{")
            rest, attrs = rest[:i].strip(), rest[i:]
        out.append({"name": name.strip(), "type": rest, "attributes": attrs})
    return out


def parse_declaration(decl: str) -> tuple:
    """(arguments, results) of an `iree.abi.declaration` string, as lists of {"name", "type", "attributes"}."""
    i = decl.index("(")
    depth = 0
    for j in range(i, len(decl)):
        depth += decl[j] == "("
        depth -= decl[j] == ")"
        if depth == 0:
            break
    args = _parse_values(decl[i + 1:j])
    rest = decl[j + 1:].strip()
    results = []
    if rest.startswith("->"):
        rest = rest[2:].strip()
        if rest.startswith("(") and rest.endswith(")"):
            rest = rest[1:-1]
        results = _parse_values(rest)
    return args, results


_FENCES = ["!hal.fence {coarse-fences wait}", "!hal.fence {coarse-fences signal}"]


def _module_exports(vmfb: bytes, names) -> tuple:
    """(functions, exports) of a module, read from its reflection.

    functions: exported name -> declaration string (the companion
    `_transients_size` functions carry no reflection; their declaration is
    derived from their entry's).  exports: exported name -> {"abi_model",
    "arguments", "results", "transients_size_function",
    "transients_size_constant"} or, for a companion, {"companion_of",
    "arguments", "results"}; arguments and results are "type {attributes}"
    strings, the arguments being the ones a caller passes at the VM level (with
    the two coarse-fences fences last).
    """
    import iree.runtime as rt
    inst = rt.VmInstance()
    mod = rt.VmModule.copy_buffer(inst, vmfb)
    functions, exports = {}, {}

    def fmt(values):
        return [v["type"] + (f" {v['attributes']}" if v["attributes"] else "") for v in values]

    for n in names:
        f = mod.lookup_function(n)
        if f is None:
            continue
        refl = dict(f.reflection)
        decl = refl.get("iree.abi.declaration", "")
        model = refl.get("iree.abi.model", "")
        try:
            args, results = parse_declaration(decl) if decl else ([], [])
        except ValueError:
            args, results = [], []
        vm_args = fmt(args) + (_FENCES if model == "coarse-fences" else [])
        functions[n] = decl or str(f)
        exports[n] = {"abi_model": model, "arguments": vm_args, "results": fmt(results),
                      "transients_size_function": refl.get("iree.abi.transients.size"),
                      "transients_size_constant": refl.get("iree.abi.transients.size.constant")}
        size_name = refl.get("iree.abi.transients.size") or n + "_transients_size"
        if mod.lookup_function(size_name) is not None:
            sig = ", ".join(f"%arg{i}: {a}" for i, a in enumerate(vm_args))
            functions[size_name] = f"func @{size_name}({sig}) -> i64  (workspace bytes of @{n})"
            exports[size_name] = {"companion_of": n, "arguments": vm_args, "results": ["i64"]}
    return functions, exports


@dataclasses.dataclass
class BuildResult:
    """Outcome of one build: counts, failures as (kernel_name, target, message), seconds."""

    compiled: int = 0
    reused: int = 0
    failed: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0


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
        exists but cannot be read (EACCES).
        """
        path = os.path.join(self.root, MANIFEST)
        try:
            with open(path, "rb") as f:
                m = json.loads(f.read())
        except FileNotFoundError:
            return {"artifacts": {}}
        except ValueError:
            return {"artifacts": {}}
        if not isinstance(m, dict) or not isinstance(m.get("artifacts"), dict):
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
                                 mode=0o666)

    def _update_manifest(self, entries: dict):
        """Adds `entries` to the manifest: under the store's lock, re-reading it first, so that
        concurrent writers (threads or processes) never drop each other's entries."""
        with _process_lock(self.root), self.lock():
            remove_stale_temporaries(self.root)
            m = self.manifest()
            m["artifacts"].update(entries)
            m["compiler_version"] = compiler_version()
            _atomic_write(os.path.join(self.root, MANIFEST), json.dumps(m, indent=1, sort_keys=True).encode())

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
            return None, "unreadable", f"cannot read {os.path.join(self.root, MANIFEST)}: {_why(e)}"
        if entry is None or not os.path.exists(path):
            return None, "missing", ""
        if not isinstance(entry, dict):
            return None, "corrupt", f"its manifest entry is malformed ({type(entry).__name__}, not an object)"
        # Without a compiler here (a runtime-only install) the module's own compiler version
        # is taken as given: the source, flags and CPU must still match.
        if entry.get("key") != artifact_key(spec, target, compiler=compiler_version() or
                                            str(entry.get("compiler_version"))):
            return None, "stale", "stale (rendered source, flags, compiler version or host CPU changed)"
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            return None, "unreadable", f"cannot read {path}: {_why(e)}"
        if _sha256(data) != entry.get("vmfb_sha256"):
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
            then = "it will be rebuilt" if state != "unreadable" else "it is skipped"
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
        _atomic_write(p["mlir"], source.encode())
        t0 = time.perf_counter()
        vmfb, cmd, cwd = compile_file(p["mlir"], target.flags)
        compile_seconds = time.perf_counter() - t0
        _atomic_write(p["cmd"], (f"cd {shlex.quote(cwd)} && {shlex.join(cmd)} > "
                                 f"{shlex.quote(os.path.basename(p['vmfb']))}\n").encode())
        _atomic_write(p["vmfb"], vmfb)
        functions, exports = _module_exports(vmfb, spec.function_names(target))
        tsrc = template_source(spec)
        entry = {
            "op": spec.op,
            "kernel_name": spec.kernel_name,
            "specialisation": {k: v for k, v in dataclasses.asdict(spec).items()},
            "template": spec.template,
            "template_sha256": _sha256(tsrc.encode()),
            "template_params": spec.template_params(target),
            "functions": functions,
            "exports": exports,
            "target": target.name,
            "target_arch": target.arch,
            "driver": target.driver,
            "flags": list(target.flags),
            "command": cmd,
            "command_cwd": cwd,
            "compiler_version": compiler_version(),
            "compiler_build": compiler_build(),
            "key": artifact_key(spec, target, source),
            "source_sha256": _sha256(source.encode()),
            "vmfb_sha256": _sha256(vmfb),
            "vmfb_bytes": len(vmfb),
            "files": {k: os.path.relpath(v, self.root) for k, v in p.items()},
            "compile_seconds": round(compile_seconds, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if target.name == "llvm-cpu":
            entry["target_cpu"] = target.arch
            if target.arch == "host":
                entry["host_cpu"] = host_cpu()
        self._update_manifest({self.artifact_id(spec, target): entry})
        return vmfb, entry

    def get_or_build(self, spec, target) -> bytes:
        """A valid artifact's bytes, compiling it first when missing, stale or corrupt."""
        data = self.lookup(spec, target)
        if data is None:
            data, _ = self.build_one(spec, target)
        return data

    def build(self, specs, targets, jobs: int | None = None, progress: bool = True) -> BuildResult:
        """Builds every (spec, target) pair that is not valid already, `jobs` compiles at a time.

        A failed compile is recorded in the result and the others go on.
        """
        from concurrent.futures import ThreadPoolExecutor

        from .compile import CompileError

        t0 = time.perf_counter()
        res = BuildResult()
        todo = []
        for t in targets:
            for s in specs:
                if self.lookup(s, t) is not None:
                    res.reused += 1
                else:
                    todo.append((s, t))
        if todo:
            require_compiler()  # say it once, not once per module

        def work(item):
            s, t = item
            try:
                self.build_one(s, t)
                return None
            except CompileError as e:
                return (s.kernel_name, t.name, f"command: {shlex.join(e.command)}\n{e.stderr.strip()}")
            except Exception as e:  # a template that does not render, an unreadable module: report, go on
                return (s.kernel_name, t.name, f"{type(e).__name__}: {e}")

        bar = None
        if progress and todo:
            from tqdm import tqdm
            bar = tqdm(total=len(todo), desc="compiling", unit="module")
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as ex:
            for failure in ex.map(work, todo):
                if failure:
                    res.failed.append(failure)
                else:
                    res.compiled += 1
                if bar:
                    bar.update(1)
        if bar:
            bar.close()
        res.seconds = time.perf_counter() - t0
        return res
