"""Renders a specialisation's Jinja2 template to MLIR text."""
from __future__ import annotations

import functools
import io
import os

import jinja2
import jinja2.meta

from .files import cache_dir, read_regular

_BYTECODE_MAX_BYTES = 64 << 20  # the grid sampler's compiled template is about 1 MiB

__all__ = ["render", "template_files", "numbered"]


class _BytecodeCache(jinja2.FileSystemBytecodeCache):
    """Jinja2's compiled templates kept on disk (`<cache_dir>/jinja2`): parsing and compiling
    the grid sampler's template took 0.45-0.7 s in each process before its first module could
    be found (its key hashes the rendered source); from the cache, 0.02 s.  Jinja2 checks each
    entry against the template's source and the Python version and writes it atomically.
    Best effort: a directory that cannot be made or written, or a damaged entry, means
    compiling the template as without a cache."""

    def load_bytecode(self, bucket) -> None:
        try:  # a regular file only, and bounded: a FIFO or /dev/zero there must not block or fill memory
            data = read_regular(self._get_cache_filename(bucket), _BYTECODE_MAX_BYTES)
            bucket.load_bytecode(io.BytesIO(data))
        except FileNotFoundError:
            pass
        except Exception:  # noqa: BLE001 - a damaged entry (marshal's errors vary): compile again
            bucket.reset()

    def dump_bytecode(self, bucket) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    # StrictUndefined: a misspelt parameter fails at render time, not as an MLIR error.
    return jinja2.Environment(
        loader=jinja2.PackageLoader("aclnn_iree.templates", ""),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_BytecodeCache(os.path.join(cache_dir(), "jinja2")),
    )


def template_files(spec) -> dict:
    """{path: source text} of every template file `spec`'s module is rendered from: its family's
    root (`spec.template`) first, then each file it imports or includes, transitively, in the
    order first met (paths relative to templates/).  The manifest records their sha256."""
    env = _environment()
    files, todo = {}, [spec.template]
    while todo:
        name = todo.pop(0)
        if name in files:
            continue
        files[name] = env.loader.get_source(env, name)[0]
        todo.extend(_referenced(files[name]))
    return files


@functools.lru_cache(maxsize=256)
def _referenced(source: str) -> tuple:
    """The templates `source` imports or includes (each names its file literally: a computed
    name would be None, and there is none), parsed once per text: every specialisation of a
    family reads the same files."""
    return tuple(n for n in jinja2.meta.find_referenced_templates(_environment().parse(source)) if n)


def render(spec, target=None) -> str:
    """MLIR source of `spec`'s module for `target` (default: a CPU target): one
    `hal.executable.source` plus its exported functions.  GPU targets get the GPU
    forms of the dispatches."""
    return _environment().get_template(spec.template).render(**spec.template_params(target))


def numbered(text: str) -> str:
    """`text` with 1-based line numbers, for error messages about rendered MLIR."""
    return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(text.splitlines(), 1))
