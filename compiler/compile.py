"""Compiles rendered MLIR to a vmfb with the iree-compile tool of iree-base-compiler.

The compiler is optional at run time: a machine with prebuilt artifacts needs only
iree-base-runtime (docs/build.md#running-without-the-compiler), so a missing compiler is
an error only when a compile is asked for.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys

from .render import numbered

__all__ = ["CompileError", "CompilerMissing", "compile_file", "compile_command", "compiler_build",
           "compiler_version", "compiler_available", "require_compiler"]

INSTALL_HINT = "pip install iree-base-compiler==3.13.0"


class CompileError(RuntimeError):
    """iree-compile rejected a module: carries the command, the compiler's message and the numbered MLIR."""

    def __init__(self, name: str, command: list, stderr: str, source: str):
        self.name, self.command, self.stderr, self.source = name, command, stderr, source
        super().__init__(
            f"iree-compile failed for {name}\ncommand: {' '.join(command)}\n{stderr.strip()}\n"
            f"--- rendered MLIR ---\n{numbered(source)}")


class CompilerMissing(ImportError):
    """A compile was needed and iree-base-compiler is not installed."""


@functools.cache  # installed packages do not change under a running process
def compiler_version() -> str | None:
    """Version of the installed iree-base-compiler (part of every cache key), None when it is
    not installed or cannot be imported (then nothing can compile here)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        import iree.compiler  # noqa: F401
        return version("iree-base-compiler")
    except (ImportError, PackageNotFoundError):
        return None


def _settle_compiler_import():
    """Before a fork: where another thread is importing iree.compiler (compiler_version's
    first call), wait for that import to end, so that the child does not inherit the
    module's import lock held by a thread it does not have (its first lookup then hung
    forever).  Nothing to do, and no import, where nobody has started one."""
    if "iree.compiler" in sys.modules:
        compiler_version()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_settle_compiler_import)


def compiler_available() -> bool:
    """Whether iree-compile can run here (iree-base-compiler installed and importable)."""
    return compiler_version() is not None


def require_compiler():
    """Raises CompilerMissing, with what to do, unless iree-compile can run here."""
    if not compiler_available():
        raise CompilerMissing(f"iree-base-compiler is not installed: {INSTALL_HINT}, or run modules "
                              "built elsewhere with `aclnn-iree build` (ACLNN_IREE_ARTIFACTS=DIR)")


def compile_command(flags, src_name: str) -> list:
    """The exact iree-compile command line (a list, never a shell string) that compiles the file
    `src_name` (relative to the working directory) and writes the module to stdout.
    Raises CompilerMissing when iree-base-compiler is not installed."""
    require_compiler()
    from iree.compiler.tools.binaries import find_tool
    return [find_tool("iree-compile"), *flags, src_name, "-o", "-"]


def compile_file(path: str, flags) -> tuple:
    """Compiles the MLIR file `path`; returns (vmfb bytes, command list, working directory).

    The compiler runs in the file's directory on its base name: iree-compile embeds the
    source path in the module's locations, so a module compiled this way has the same bytes
    whatever directory holds it (two processes or two stores compile the same bytes).  No
    temporary file is written anywhere: the module comes back on stdout.
    Raises CompileError with the compiler's message and the MLIR with line numbers,
    CompilerMissing when iree-base-compiler is not installed.
    """
    cwd, name = os.path.split(os.path.abspath(path))
    cmd = compile_command(flags, name)
    # Its own session: a Ctrl-C at the terminal reaches Python, not the compiler (a compile
    # that a worker thread started then ends normally; one the interrupted thread waits for
    # is killed by subprocess.run), never a half-run compile's misleading error.
    proc = subprocess.run(cmd, capture_output=True, cwd=cwd, start_new_session=True)
    if proc.returncode != 0 or not proc.stdout:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
        raise CompileError(os.path.splitext(name)[0], cmd, proc.stderr.decode(errors="replace"), source)
    return proc.stdout, cmd, cwd


@functools.lru_cache(maxsize=None)
def target_cpu_features(cpu: str) -> tuple:
    """The LLVM features ("+avx2", ...) that iree-compile enables for the LLVM CPU `cpu`, read
    from the executable target it makes for a trivial module (about 0.3 s); () when the
    compiler is missing or does not say.  Recorded in the manifest of modules built for a
    named CPU, so that a runtime can refuse them on a CPU without those features (a SIGILL
    otherwise)."""
    import re
    try:
        from iree.compiler.tools.binaries import find_tool
        from .targets import get_target
        src = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n"
        out = subprocess.run([find_tool("iree-compile"), *get_target("llvm-cpu", cpu).flags,
                              "--compile-to=executable-sources", "-"], input=src, capture_output=True, text=True,
                             timeout=120).stdout
    except Exception:  # noqa: BLE001 - no compiler, a CPU LLVM rejects: nothing recorded
        return ()
    m = re.search(r'cpu_features = "([^"]*)"', out)
    return tuple(f for f in m.group(1).split(",") if f) if m else ()


@functools.cache
def compiler_build() -> str:
    """The first lines of `iree-compile --version` (exact IREE and LLVM revisions), or "" when unavailable."""
    try:
        from iree.compiler.tools.binaries import find_tool
        out = subprocess.run([find_tool("iree-compile"), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except Exception:
        return ""
    return "; ".join(ln.strip() for ln in out.splitlines() if ln.strip() and "iree.dev" not in ln)
