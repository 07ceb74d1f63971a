"""Resolves a specialisation to a compiled module for a device.

Order (docs/build.md#where-modules-come-from):
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

import contextlib
import logging
import os
import platform
import stat
import sys
import threading
import warnings
from pathlib import Path

from ..compiler.build import ArtifactStore, target_folder
from ..compiler.compile import INSTALL_HINT, compiler_available
from ..compiler.files import cache_dir  # the per-user cache (or ACLNN_IREE_CACHE), shared with render.py
from ..compiler.key import host_cpu, host_feature_table
from ..compiler.targets import CPU_ARCH_ENV, build_args, target_for_driver

_log = logging.getLogger(__name__)

__all__ = ["ArtifactMissing", "UnsupportedCpu", "is_offline", "load_module_bytes", "prepare", "set_artifacts_dir", "set_offline",
           "search_dirs", "search_order", "search_places", "cache_dir", "PROJECT_ARTIFACTS", "default_artifacts_dir"]


def default_artifacts_dir() -> Path:
    """`artifacts/` of the source checkout the package runs from (aclnn_iree.core.install.source_checkout),
    else `<platformdirs user data dir>/artifacts` of an installed package, which `pip uninstall`
    leaves alone and which is never in site-packages."""
    from ..core.install import source_checkout
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


class UnsupportedCpu(RuntimeError):
    """A module built for a named CPU (ACLNN_IREE_CPU_ARCH) needs features this CPU lacks:
    running it would kill the process with SIGILL."""


def _check_runs_here(store, spec, target):
    """Raises UnsupportedCpu when `spec`'s module in `store`, built for a named CPU, needs
    features this CPU lacks, as iree-cpuinfo names them (the manifest records the module's
    features, compiler.compile.target_cpu_features; host builds are keyed to this CPU)."""
    if target.name != "llvm-cpu" or target.arch == "host":
        return
    try:
        entry = store._entry(spec, target)
    except OSError:
        return
    need = entry.get("cpu_features") if isinstance(entry, dict) else None
    if not isinstance(need, list):
        return
    have = host_feature_table() or {}
    missing = sorted({f[1:] for f in need if isinstance(f, str) and f.startswith("+") and have.get(f[1:]) is False})
    if missing:
        model = host_cpu().get("model") or platform.machine()
        raise UnsupportedCpu(
            f"{spec.kernel_name} was built for the CPU {target.arch!r} ({CPU_ARCH_ENV}={target.arch}), which has "
            f"{', '.join(missing)}; this CPU ({model}) does not, and would stop the process (SIGILL) running "
            f"it: unset {CPU_ARCH_ENV} (modules for this CPU), or name a CPU this one can run, e.g. x86-64-v3")


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


def search_places() -> list:
    """(directory, kind) of every place modules are looked for, in order, each directory once:
    "explicit" (set_artifacts_dir), "env" (ACLNN_IREE_ARTIFACTS), "default" (where `aclnn-iree
    build` writes; listed whether or not it exists yet) and "cache" (the compile cache, last).
    ACLNN_IREE_ARTIFACTS adds a store; it hides none."""
    env = os.environ.get("ACLNN_IREE_ARTIFACTS")
    places = [(_explicit_dir, "explicit")] if _explicit_dir else []
    places += [(os.path.abspath(env), "env")] if env else []
    places += [(str(PROJECT_ARTIFACTS), "default"), (cache_dir(), "cache")]
    first = {}
    for d, kind in places:
        first.setdefault(d, kind)
    return list(first.items())


def search_dirs() -> list:
    """The artifact directories searched, in order (the compile cache last)."""
    return [d for d, kind in search_places() if kind != "default" or PROJECT_ARTIFACTS.is_dir()]


def search_order() -> str:
    """Where modules are looked for, in order, with this process's directories: one line
    (`aclnn-iree list` prints it)."""
    what = {"explicit": "{} (set_artifacts_dir)", "env": "ACLNN_IREE_ARTIFACTS={}",
            "default": "{} (where `aclnn-iree build` writes)",
            "cache": "the compile cache {} (where first use compiles them)"}
    places = search_places()
    env = any(kind == "env" for _, kind in places)
    return ("modules are looked for in " + ", then ".join(what[kind].format(d) for d, kind in places)
            + ("" if env else "; ACLNN_IREE_ARTIFACTS=DIR would add DIR before them"))


_warned_writable: set = set()


def _warn_if_writable_by_others(directory: str):
    """Warns once per directory when a store others may write into is used: whoever can
    write there chooses the code this process runs (a shared store should be writable by its
    owner or group only; a sticky /tmp-like directory is no exception)."""
    if directory in _warned_writable:
        return
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return
    if mode & stat.S_IWOTH:
        _warned_writable.add(directory)
        warnings.warn(f"artifact store {directory} is writable by every user (mode {stat.S_IMODE(mode):o}): "
                      f"anyone can replace the code it runs; make it writable by its owner or group only "
                      f"(chmod o-w)", RuntimeWarning, stacklevel=4)


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
    data, store = _resolve(spec, target)
    _check_runs_here(store, spec, target)
    return data, target, store.paths(spec, target)["vmfb"]


def _resolve(spec, target):
    """(vmfb bytes, the ArtifactStore holding them) of `spec` for `target` (load_module_bytes)."""
    dirs = search_dirs()
    for d in dirs[:-1]:
        st = ArtifactStore(d)
        _warn_if_writable_by_others(d)
        data = st.lookup(spec, target)
        if data is not None:
            return data, st
    cache = ArtifactStore(dirs[-1])
    _warn_if_writable_by_others(dirs[-1])
    why = _no_compile_reason()
    if why:
        data = cache.lookup(spec, target)
        if data is not None:
            return data, cache
        found = []
        for d in dirs:
            st = ArtifactStore(d)
            _, state, problem = st.find(spec, target)
            found.append(st.paths(spec, target)["vmfb"] + f" ({problem or state})")
        raise ArtifactMissing(
            f"{why}: no valid artifact for {spec.kernel_name} ({target_folder(target)}); looked for "
            + ", ".join(found) + f". Build it first: `aclnn-iree build {build_args(target, [spec.form])}`, here or on a "
            "machine with the compiler (then point ACLNN_IREE_ARTIFACTS at the folder).")
    data = cache.lookup(spec, target, warn=False)  # get_or_build warns of a damaged one
    if data is None:
        data = _compile_on_first_use(cache, spec, target)
    return data, cache


_announced: set = set()  # target folders whose first compile on first use this process announced
_announced_lock = threading.Lock()


def _compile_on_first_use(cache, spec, target) -> bytes:
    """cache.get_or_build(spec, target) for a module no store holds, said first in one log
    line (logger "aclnn_iree.runtime.store"): the kernel, the target, that it takes seconds
    once, and the command that builds every kernel ahead.  WARNING for a target's first such
    compile in the process, which Python prints to stderr without any logging set up; INFO
    for the others (a first call of a model compiles dozens).  Where stderr is a terminal a
    progress bar counts the seconds; elsewhere nothing but the log line is printed."""
    folder = target_folder(target)
    with _announced_lock:
        first = folder not in _announced
        _announced.add(folder)
    _log.log(logging.WARNING if first else logging.INFO,
             "compiling %s for %s on first use: a few seconds, once (kept in %s); `aclnn-iree build %s` "
             "compiles every kernel ahead of time", spec.kernel_name, folder, cache.root, build_args(target, [spec.form]))
    with _elapsed_bar(f"compiling {spec.kernel_name} for {folder}"):
        return cache.get_or_build(spec, target)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


@contextlib.contextmanager
def _elapsed_bar(label: str):
    """A tqdm bar showing `label` and the seconds spent in the block, refreshed twice a second,
    and cleared after it; only where stderr is a terminal (no output, no thread elsewhere)."""
    if not _stderr_is_terminal():
        yield
        return
    from tqdm import tqdm  # not tqdm.auto: its notebook and rich forms warn (TqdmExperimentalWarning)
    bar = tqdm(total=1, desc=label, bar_format="{desc} ({elapsed})", file=sys.stderr, leave=False)
    done = threading.Event()

    def tick():  # tqdm redraws only on update(): one compile is one update, seconds later
        while not done.wait(0.5):
            bar.refresh()
    ticker = threading.Thread(target=tick, name="aclnn-iree-compile-bar", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()


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
    # as the target runs them (the linalg form where it has no tuned forms), each once
    specs = list(dict.fromkeys(s for s in (s.for_target(target) for s in specs) if s is not None))
    todo = [s for s in specs if not any(ArtifactStore(d).status(s, target) == "ok" for d in dirs)]
    why = _no_compile_reason() if todo else None
    if why:
        names = ", ".join(s.kernel_name for s in todo[:5]) + (f" and {len(todo) - 5} more" if len(todo) > 5 else "")
        kernels = " ".join(f"--kernel {s.kernel_name}" for s in todo) if len(todo) <= 5 else ""
        raise ArtifactMissing(f"{why}: {len(todo)} of {len(specs)} modules for {target_folder(target)} are in "
                              f"none of {', '.join(dirs)}: {names}; build them: "
                              f"`aclnn-iree build {build_args(target, [s.form for s in todo])}"
                              f"{' ' + kernels if kernels else ''}`")
    if not todo:
        return BuildResult(reused=len(specs))
    result = ArtifactStore(dirs[-1]).build(todo, [target], jobs=jobs, progress=progress)
    result.reused += len(specs) - len(todo)
    return result
