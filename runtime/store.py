"""Resolves a specialisation to a compiled module for a device.

Order (README "Where modules come from"):
1. an artifacts directory given by the caller (`set_artifacts_dir`) or by the
   environment variable ACLNN_IREE_ARTIFACTS (read when used, not at import);
2. the default artifacts directory, where `aclnn-iree build` writes: the project's
   `artifacts/` in a source checkout, the per-user data directory (platformdirs)
   for an installed package (never inside site-packages);
3. compile on first use into the per-user cache directory (platformdirs),
   unless offline (`set_offline(True)` or ACLNN_IREE_OFFLINE=1) or iree-base-compiler
   is not installed (a runtime-only install), which raise ArtifactMissing naming the
   artifact and the build command instead.

CPU devices run modules built for the host CPU, or for the CPU named by
ACLNN_IREE_CPU_ARCH (e.g. x86-64-v3: modules that travel to other machines).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..compiler.build import ArtifactStore, target_folder
from ..compiler.compile import INSTALL_HINT, compiler_available
from ..compiler.files import cache_dir  # the per-user cache (or ACLNN_IREE_CACHE), shared with render.py
from ..compiler.targets import build_args, target_for_driver

__all__ = ["ArtifactMissing", "is_offline", "load_module_bytes", "prepare", "set_artifacts_dir", "set_offline",
           "search_dirs", "cache_dir", "PROJECT_ARTIFACTS", "default_artifacts_dir"]


def default_artifacts_dir() -> Path:
    """`artifacts/` of the source checkout the package runs from (aclnn_iree.install.source_checkout),
    else `<platformdirs user data dir>/artifacts` of an installed package, which `pip uninstall`
    leaves alone and which is never in site-packages."""
    from ..install import source_checkout
    root = source_checkout()
    if root is not None:
        return root / "artifacts"
    import platformdirs
    return Path(platformdirs.user_data_dir("aclnn-iree")) / "artifacts"


PROJECT_ARTIFACTS = default_artifacts_dir()

_explicit_dir = None
_offline = None


class ArtifactMissing(FileNotFoundError):
    """Offline mode and no valid artifact for a specialisation: names the paths searched."""


def set_artifacts_dir(path):
    """Uses `path` (or, with None, the default order) as the first artifacts directory."""
    global _explicit_dir
    _explicit_dir = None if path is None else os.path.abspath(os.fspath(path))


def set_offline(flag):
    """True: never compile at run time; a missing artifact raises ArtifactMissing. None: from the environment."""
    global _offline
    _offline = flag


def is_offline() -> bool:
    """Whether modules must not compile at run time (set_offline, else ACLNN_IREE_OFFLINE)."""
    if _offline is not None:
        return bool(_offline)
    return os.environ.get("ACLNN_IREE_OFFLINE", "") not in ("", "0", "false", "False")


def search_dirs() -> list:
    """The artifact directories searched, in order (the compile cache last)."""
    dirs = []
    if _explicit_dir:
        dirs.append(_explicit_dir)
    env = os.environ.get("ACLNN_IREE_ARTIFACTS")
    if env:
        dirs.append(os.path.abspath(env))
    if PROJECT_ARTIFACTS.is_dir():
        dirs.append(str(PROJECT_ARTIFACTS))
    dirs.append(cache_dir())
    return list(dict.fromkeys(dirs))


def _no_compile_reason() -> str | None:
    """Why modules cannot compile at run time here (offline, or no compiler), or None."""
    if is_offline():
        return "offline mode"
    if not compiler_available():
        return f"iree-base-compiler is not installed ({INSTALL_HINT})"
    return None


def load_module_bytes(spec, device_name: str):
    """(vmfb bytes, target, path) of `spec` for the device `device_name`, following the order above."""
    target = target_for_driver(device_name)
    dirs = search_dirs()
    for d in dirs[:-1]:
        st = ArtifactStore(d)
        data = st.lookup(spec, target)
        if data is not None:
            return data, target, st.paths(spec, target)["vmfb"]
    cache = ArtifactStore(dirs[-1])
    why = _no_compile_reason()
    if why:
        data = cache.lookup(spec, target)
        if data is not None:
            return data, target, cache.paths(spec, target)["vmfb"]
        found = []
        for d in dirs:
            st = ArtifactStore(d)
            _, state, problem = st.find(spec, target)
            found.append(st.paths(spec, target)["vmfb"] + f" ({problem or state})")
        raise ArtifactMissing(
            f"{why}: no valid artifact for {spec.kernel_name} ({target_folder(target)}); looked for "
            + ", ".join(found) + f". Build it first: `aclnn-iree build {build_args(target)}`, here or on a "
            "machine with the compiler (then point ACLNN_IREE_ARTIFACTS at the folder).")
    return cache.get_or_build(spec, target), target, cache.paths(spec, target)["vmfb"]


def prepare(specs, device_name: str, jobs: int | None = None, progress: bool = False):
    """Compiles now, `jobs` at a time (default: the CPU count), the modules of `specs` for the
    device `device_name` that load_module_bytes would otherwise compile one at a time on first
    use: those valid in no searched directory, into the compile cache.

    Returns the compiler.build.BuildResult: `reused` counts the modules already valid in a
    searched directory, `failed` lists (kernel_name, target, message) for compiles that failed
    (a later call of that kernel reports the same error); a spec given twice counts once.
    Offline or without the compiler it compiles nothing and raises ArtifactMissing when any
    module is missing, naming them and the `aclnn-iree build` command that makes them.
    Raises ValueError for an unknown device or a `jobs` below 1, TypeError for a device name
    that is not a string.
    """
    from ..compiler.build import BuildResult
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be an IREE device name such as 'local-task', got {device_name!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be a positive int or None (the CPU count), got {jobs!r}")
    target = target_for_driver(device_name)
    dirs = search_dirs()
    specs = list(dict.fromkeys(specs))  # a spec named twice is one module
    todo = [s for s in specs if not any(ArtifactStore(d).status(s, target) == "ok" for d in dirs)]
    why = _no_compile_reason() if todo else None
    if why:
        names = ", ".join(s.kernel_name for s in todo[:5]) + (f" and {len(todo) - 5} more" if len(todo) > 5 else "")
        kernels = " ".join(f"--kernel {s.kernel_name}" for s in todo) if len(todo) <= 5 else ""
        raise ArtifactMissing(f"{why}: {len(todo)} of {len(specs)} modules for {target_folder(target)} are in "
                              f"none of {', '.join(dirs)}: {names}; build them: "
                              f"`aclnn-iree build {build_args(target)}{' ' + kernels if kernels else ''}`")
    if not todo:
        return BuildResult(reused=len(specs))
    result = ArtifactStore(dirs[-1]).build(todo, [target], jobs=jobs, progress=progress)
    result.reused += len(specs) - len(todo)
    return result
