"""The shape of templates/ that CONTRIBUTING promises: one folder per kernel family holding a
thin root (`module.mlir.j2`, the tuned forms), one partial per form, and the linalg form
(`linalg.mlir.j2`, a root of its own), shared macros in `_common.mlir.j2`,
every file short, no macro inside another, each macro's inputs its arguments (no partial
imported `with context`), and a one-line comment of what each macro emits right above it."""
from __future__ import annotations

import pathlib
import re

import jinja2
import jinja2.nodes
import pytest

from aclnn_iree.compiler.render import _environment, template_files
from aclnn_iree.compiler.specs import FORMS, all_specs

TEMPLATES = pathlib.Path(__file__).resolve().parent.parent / "templates"
FILES = sorted(p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*.mlir.j2"))
MAX_LINES = 600
ROOT_MAX_LINES = 250


def test_one_folder_per_family_with_a_root():
    top = [f for f in FILES if "/" not in f]
    assert top == ["_common.mlir.j2"], "only the shared macros stand at the top of templates/"
    families = {f.split("/")[0] for f in FILES if "/" in f}
    assert all(f.count("/") == 1 for f in FILES if "/" in f)
    for fam in families:
        assert f"{fam}/module.mlir.j2" in FILES, f"family {fam} has no root module.mlir.j2"
    # every spec renders from its family's root (tuned) or its linalg form, and every template
    # file is used by some spec
    used = set()
    for spec in all_specs(forms=FORMS):
        assert spec.template == f"{spec.op}/{'linalg' if spec.linalg else 'module'}.mlir.j2"
        used.update(template_files(spec))
    assert used == set(FILES), f"unused template files: {sorted(set(FILES) - used)}"


@pytest.mark.parametrize("name", FILES)
def test_file_is_short(name):
    n = len((TEMPLATES / name).read_text().splitlines())
    limit = ROOT_MAX_LINES if name.endswith("/module.mlir.j2") else MAX_LINES
    assert n <= limit, f"{name} has {n} lines (at most {limit}): split it by form"


@pytest.mark.parametrize("name", FILES)
def test_no_context_imports_and_no_nested_macros(name):
    text = (TEMPLATES / name).read_text()
    assert not re.search(r"\bwith\s+context\b", text), f"{name} imports with context: pass arguments"
    tree = _environment().parse(text)
    for macro in tree.find_all(jinja2.nodes.Macro):
        inner = [m.name for m in macro.find_all(jinja2.nodes.Macro)]
        assert not inner, f"{name}: macro {macro.name} defines {inner} inside it"


@pytest.mark.parametrize("name", FILES)
def test_each_macro_says_what_it_emits(name):
    """The nearest non-blank line above each `{% macro %}` closes a Jinja comment (the macro's
    one-line statement of what it emits, possibly followed by more lines of why)."""
    lines = (TEMPLATES / name).read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*\{%-?\s*macro\s", line):
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            assert j >= 0 and lines[j].rstrip().endswith("#}"), (
                f"{name}:{i + 1}: macro without a comment above it saying what it emits")
