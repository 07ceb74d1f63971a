"""Compiles rendered MLIR to a vmfb with the iree-compile tool of iree-base-compiler."""
from __future__ import annotations

import os
import subprocess
import tempfile

from iree.compiler.tools.binaries import find_tool

from .render import numbered

__all__ = ["CompileError", "compile_mlir", "compile_command", "compiler_version"]


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


def compile_command(flags, src_path: str, out_path: str) -> list:
    """The exact iree-compile command line (a list, never a shell string)."""
    return [find_tool("iree-compile"), *flags, src_path, "-o", out_path]


def compile_mlir(source: str, flags, name: str = "module", workdir: str | None = None) -> tuple:
    """Compiles MLIR text with `flags`; returns (vmfb bytes, command list).

    Raises CompileError with the compiler's message and the MLIR with line numbers.
    """
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        src = os.path.join(tmp, f"{name}.mlir")
        out = os.path.join(tmp, f"{name}.vmfb")
        with open(src, "w") as f:
            f.write(source)
        cmd = compile_command(flags, src, out)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(name, cmd, proc.stderr, source)
        with open(out, "rb") as f:
            return f.read(), cmd
