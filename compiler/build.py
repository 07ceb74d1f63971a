"""Artifact store: compiled modules on disk, their manifest, and the ahead-of-time build.

Layout of a store directory (one vmfb per specialisation and target, see README
"Module granularity"):

    <dir>/<target>/<kernel_name>.vmfb    the module
    <dir>/<target>/<kernel_name>.mlir    its rendered source
    <dir>/<target>/<kernel_name>.cmd     the exact iree-compile command
    <dir>/manifest.json                  one entry per artifact

An artifact is valid only when its cache key (template text, template
parameters, compile flags, IREE compiler version) and the sha256 of its vmfb
match the manifest; anything else is reported and rebuilt, never loaded.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import tempfile
import threading
import time
import warnings

from .compile import compile_mlir, compiler_version
from .render import render, template_source

__all__ = ["ArtifactStore", "artifact_key", "BuildResult"]

MANIFEST = "manifest.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_key(spec, target) -> str:
    """Cache key of `spec` compiled for `target`: template text, parameters, flags, compiler version."""
    payload = json.dumps({
        "template": template_source(spec),
        "params": spec.template_params(),
        "flags": list(target.flags),
        "compiler": compiler_version(),
    }, sort_keys=True)
    return _sha256(payload.encode())


def _atomic_write(path: str, data: bytes):
    """Writes `data` to `path` through a temporary file and os.replace (readers never see half a file)."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _signatures(vmfb: bytes, names) -> dict:
    """Exported function name -> its ABI declaration, read from the module's reflection."""
    import iree.runtime as rt
    inst = rt.VmInstance()
    mod = rt.VmModule.copy_buffer(inst, vmfb)
    out = {}
    for n in names:
        for fname in (n, n + "_transients_size"):
            f = mod.lookup_function(fname)
            if f is not None:
                out[fname] = f.reflection.get("iree.abi.declaration", str(f))
    return out


@dataclasses.dataclass
class BuildResult:
    """Outcome of one build: counts, failures as (kernel_name, target, message), seconds."""

    compiled: int = 0
    reused: int = 0
    failed: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0


class ArtifactStore:
    """A directory of compiled modules with a manifest (thread-safe within a process)."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        self._lock = threading.Lock()

    # -- manifest --------------------------------------------------------------
    def manifest(self) -> dict:
        """The manifest ({"artifacts": {id: entry}}); empty when absent or unreadable."""
        try:
            with open(os.path.join(self.root, MANIFEST)) as f:
                m = json.load(f)
            return m if isinstance(m.get("artifacts"), dict) else {"artifacts": {}}
        except (OSError, ValueError, AttributeError):
            return {"artifacts": {}}

    def _update_manifest(self, entries: dict):
        with self._lock:
            m = self.manifest()
            m["artifacts"].update(entries)
            m["compiler_version"] = compiler_version()
            _atomic_write(os.path.join(self.root, MANIFEST), json.dumps(m, indent=1, sort_keys=True).encode())

    @staticmethod
    def artifact_id(spec, target) -> str:
        return f"{target.name}/{spec.kernel_name}"

    def paths(self, spec, target) -> dict:
        base = os.path.join(self.root, target.name, spec.kernel_name)
        return {"vmfb": base + ".vmfb", "mlir": base + ".mlir", "cmd": base + ".cmd"}

    # -- lookup ----------------------------------------------------------------
    def lookup(self, spec, target, warn: bool = True):
        """The vmfb bytes of a valid artifact, or None.

        Missing artifacts return None silently; a stale (key or compiler version
        changed) or corrupt (sha256 mismatch) one returns None with a warning.
        """
        entry = self.manifest()["artifacts"].get(self.artifact_id(spec, target))
        path = self.paths(spec, target)["vmfb"]
        if entry is None or not os.path.exists(path):
            return None
        problem = None
        if entry.get("key") != artifact_key(spec, target):
            problem = "stale (template, parameters, flags or compiler version changed)"
        else:
            with open(path, "rb") as f:
                data = f.read()
            if _sha256(data) != entry.get("vmfb_sha256"):
                problem = "corrupt (sha256 of the vmfb does not match the manifest)"
        if problem:
            if warn:
                warnings.warn(f"artifact {path} is {problem}; it will be rebuilt", RuntimeWarning, stacklevel=3)
            return None
        return data

    # -- build -----------------------------------------------------------------
    def build_one(self, spec, target) -> tuple:
        """Compiles `spec` for `target` into the store; returns (vmfb bytes, manifest entry).

        Raises aclnn_iree.compiler.CompileError when iree-compile fails.
        """
        source = render(spec)
        p = self.paths(spec, target)
        vmfb, cmd = compile_mlir(source, target.flags, spec.kernel_name)
        cmd = [cmd[0], *target.flags, p["mlir"], "-o", p["vmfb"]]  # as it would be run in the store
        _atomic_write(p["mlir"], source.encode())
        _atomic_write(p["cmd"], (shlex.join(cmd) + "\n").encode())
        _atomic_write(p["vmfb"], vmfb)
        entry = {
            "op": spec.op,
            "kernel_name": spec.kernel_name,
            "specialisation": {k: v for k, v in dataclasses.asdict(spec).items()},
            "functions": _signatures(vmfb, spec.function_names),
            "target": target.name,
            "target_arch": target.arch,
            "driver": target.driver,
            "flags": list(target.flags),
            "command": cmd,
            "compiler_version": compiler_version(),
            "key": artifact_key(spec, target),
            "source_sha256": _sha256(source.encode()),
            "vmfb_sha256": _sha256(vmfb),
            "vmfb_bytes": len(vmfb),
        }
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

        def work(item):
            s, t = item
            try:
                self.build_one(s, t)
                return None
            except CompileError as e:
                return (s.kernel_name, t.name, f"command: {shlex.join(e.command)}\n{e.stderr.strip()}")

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
