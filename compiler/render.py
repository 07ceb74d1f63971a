"""Renders a specialisation's Jinja2 template to MLIR text."""
from __future__ import annotations

import functools
from importlib import resources

import jinja2

__all__ = ["render", "template_source", "numbered"]


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    # StrictUndefined: a misspelt parameter fails at render time, not as an MLIR error.
    return jinja2.Environment(
        loader=jinja2.PackageLoader("aclnn_iree.templates", ""),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def template_source(spec) -> str:
    """The raw text of the template that renders `spec` (part of the cache key)."""
    return resources.files("aclnn_iree.templates").joinpath(spec.template).read_text()


def render(spec, target=None) -> str:
    """MLIR source of `spec`'s module for `target` (default: a CPU target): one
    `hal.executable.source` plus its exported functions.  GPU targets get the GPU
    forms of the dispatches."""
    return _environment().get_template(spec.template).render(**spec.template_params(target))


def numbered(text: str) -> str:
    """`text` with 1-based line numbers, for error messages about rendered MLIR."""
    return "\n".join(f"{i:5d}  {line}" for i, line in enumerate(text.splitlines(), 1))
