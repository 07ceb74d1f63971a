"""What an artifact's validity depends on: the cache key of a specialisation compiled for a
target (the sha256 of its rendered MLIR, the flags, the compiler version) and, for modules
built for this machine's CPU, the CPU's fingerprint."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess

from .compile import compiler_version
from .render import render

__all__ = ["artifact_key", "host_cpu", "sha256_hex"]


def sha256_hex(data: bytes) -> str:
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
        table = host_feature_table()
        if table is not None:
            info["features"] = sorted(f for f, present in table.items() if present)
            info["features_from"] = "iree-cpuinfo"
        else:
            info["features"] = sorted(cpuinfo.get("flags", "").split())
            info["features_from"] = "/proc/cpuinfo"
        _host_cpu_cache = info
    return _host_cpu_cache


@functools.lru_cache(maxsize=None)
def host_feature_table() -> dict | None:
    """{LLVM feature name: present} for every feature `iree-cpuinfo` (iree-base-runtime) knows
    on this CPU (the ISA extensions IREE's CPU code generation can use); None without the tool."""
    try:
        import iree._runtime_libs as libs
        tool = os.path.join(os.path.dirname(libs.__file__), "iree-cpuinfo")
        out = subprocess.run([tool], capture_output=True, text=True, timeout=30, check=True).stdout
    except Exception:  # noqa: BLE001 - no runtime tool: nothing can be checked
        return None
    return {p[0]: p[1] == "1" for p in (ln.split() for ln in out.splitlines()) if len(p) == 2 and p[1] in ("0", "1")}


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
        "source_sha256": sha256_hex(source.encode()),
        "flags": list(spec.compile_flags(target)),
        "compiler": compiler or compiler_version(),
    }
    if target.name == "llvm-cpu" and target.arch == "host":
        h = host_cpu()
        fields["host_cpu"] = [h["machine"], h["model"], h["features"]]
    return sha256_hex(json.dumps(fields, sort_keys=True).encode())
