"""Compiles rendered MLIR to a vmfb with the iree-compile tool of iree-base-compiler."""
from __future__ import annotations

import os
import subprocess

from iree.compiler.tools.binaries import find_tool

from .render import numbered

__all__ = ["CompileError", "compile_file", "compile_command", "compiler_version"]


class CompileError(RuntimeError):
    """iree-compile rejected a module: carries the command, the compiler's message and the numbered MLIR."""

    def __init__(self, name: str, command: list, stderr: str, source: str):
        self.name, self.command, self.stderr, self.source = name, command, stderr, source
        super().__init__(
            f"iree-compile failed for {name}\ncommand: {' '.join(command)}\n{stderr.strip()}\n"
            f"--- rendered MLIR ---\n{numbered(source)}")


def compiler_version() -> str:
    """Version of the installed iree-base-compiler (part of every cache key)."""
    from importlib.metadata import version
    return version("iree-base-compiler")


def compile_command(flags, src_name: str) -> list:
    """The exact iree-compile command line (a list, never a shell string) that compiles the file
    `src_name` (relative to the working directory) and writes the module to stdout."""
    return [find_tool("iree-compile"), *flags, src_name, "-o", "-"]


def compile_file(path: str, flags) -> tuple:
    """Compiles the MLIR file `path`; returns (vmfb bytes, command list, working directory).

    The compiler runs in the file's directory on its base name: iree-compile embeds the
    source path in the module's locations, so a module compiled this way has the same bytes
    whatever directory holds it (two processes or two stores compile the same bytes).  No
    temporary file is written anywhere: the module comes back on stdout.
    Raises CompileError with the compiler's message and the MLIR with line numbers.
    """
    cwd, name = os.path.split(os.path.abspath(path))
    cmd = compile_command(flags, name)
    proc = subprocess.run(cmd, capture_output=True, cwd=cwd)
    if proc.returncode != 0 or not proc.stdout:
        with open(path, encoding="utf-8", errors="replace") as f:
            source = f.read()
        raise CompileError(os.path.splitext(name)[0], cmd, proc.stderr.decode(errors="replace"), source)
    return proc.stdout, cmd, cwd
