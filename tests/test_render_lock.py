"""The render lock: the sha256 of every specialisation's rendered MLIR for every target, and the
functions its module exports, held in tests/render_lock.json.

A refactoring of the templates or of the specialisations (moving macros, splitting files,
renaming Python) must keep every bit of what IREE compiles: this test fails on any change of
text.  A change that is meant to change text (a kernel change, or a whitespace or SSA-name
change that a refactoring cannot avoid) updates the lock in its own commit, after the
numerical suites have passed on CPU and Vulkan, with the commit message saying why:

    python tests/test_render_lock.py --write

The CPU forms are locked for both instruction sets the templates know (x86 and AArch64, as
the floating-point environment differs), whatever machine runs the test.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys

import pytest

from aclnn_iree.compiler import specs as specs_mod
from aclnn_iree.compiler.render import render
from aclnn_iree.compiler.specs import all_specs
from aclnn_iree.compiler.targets import get_target

LOCK = pathlib.Path(__file__).with_name("render_lock.json")
# (lock column, target name, the CPU instruction set the CPU forms are rendered for)
COLUMNS = (("llvm-cpu-x86", "llvm-cpu", "x86"), ("llvm-cpu-aarch64", "llvm-cpu", "aarch64"),
           ("vulkan-spirv", "vulkan-spirv", None), ("cuda", "cuda", None))
_EXPORT = re.compile(r"^\s*util\.func public @([A-Za-z0-9_]+)\(", re.M)


def _entry(spec, column: str, target_name: str, isa, monkeypatch) -> dict:
    target = get_target(target_name)
    monkeypatch.setattr(specs_mod, "cpu_isa", lambda: isa)
    monkeypatch.setattr(specs_mod, "cpu_gathers", lambda target=None: isa == "x86")  # an AVX2 host
    text = render(spec, target)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(),
            "exports": sorted(_EXPORT.findall(text)),
            "function_names": sorted(spec.function_names(target))}


def _compute(monkeypatch) -> dict:
    return {spec.kernel_name: {col: _entry(spec, col, t, isa, monkeypatch) for col, t, isa in COLUMNS}
            for spec in all_specs()}


def test_render_lock(monkeypatch):
    """Every locked specialisation x target renders exactly the locked text and exports the
    locked functions (the spec's function_names and the module's `util.func public` agree)."""
    lock = json.loads(LOCK.read_text())
    specs = {spec.kernel_name: spec for spec in all_specs()}
    assert set(lock) <= set(specs), f"specialisations gone from all_specs(): {sorted(set(lock) - set(specs))[:5]}"
    changed = []
    for name, cols in lock.items():
        for col, t, isa in COLUMNS:
            e = _entry(specs[name], col, t, isa, monkeypatch)
            assert e["exports"] == e["function_names"], (name, col)
            if e != cols[col]:
                changed.append(f"{name} {col}")
    assert not changed, (f"{len(changed)} renders differ from tests/render_lock.json, e.g. {changed[:5]}; "
                         "a refactoring must keep every bit (see this file's docstring)")


def test_every_specialisation_is_locked():
    """A new specialisation (a new operator's, a new dtype or mode) enters the lock in the
    commit that adds it: `python tests/test_render_lock.py --write` (the old entries must
    not change: test_render_lock)."""
    lock = json.loads(LOCK.read_text())
    missing = sorted({spec.kernel_name for spec in all_specs()} - set(lock))
    assert not missing, f"{len(missing)} specialisations are not in tests/render_lock.json, e.g. {missing[:3]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with pytest.MonkeyPatch.context() as mp:
        LOCK.write_text(json.dumps(_compute(mp), indent=1, sort_keys=True) + "\n")
    print(f"wrote {LOCK}")
