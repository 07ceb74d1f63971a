"""Every code block of the README, CONTRIBUTING, the changelog and the docs site runs as written.

A page's ```python blocks run in order in one fresh interpreter (a later block may use an
earlier one's names); a ```console block's `$ ` lines run in bash, each of which must exit
0.  A block that cannot run here (an install from the network, the main job, a benchmark
of minutes) is preceded by `<!-- docs-test: skip (why) -->`, whose reason must say what
runs it instead.  Other fences (text, json, mlir, c) show output or formats, not commands;
bash/sh/shell fences are refused, so that every command carries its `$ ` prompt.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
                *(ROOT / "docs").rglob("*.md")])
_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((.+?)\)\s*-->\s*$")
RUNNABLE = {"python", "console"}
REFUSED = {"bash", "sh", "shell", "py", "pycon"}


def blocks(page: pathlib.Path):
    """(language, code, skip reason or None, line number) of each fenced block of `page`."""
    text = page.read_text()
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        yield m.group(1).lower(), m.group(2), skip.group(1) if skip else None, text.count("\n", 0, m.start()) + 1


def commands(console: str) -> list:
    """The commands of a console block: its `$ ` lines, with backslash continuations joined."""
    out, current = [], None
    for line in console.splitlines():
        if current is not None:
            current += "\n" + line
        elif line.startswith("$ "):
            current = line[2:]
        else:
            continue  # the command's output
        if not current.endswith("\\"):
            out.append(current)
            current = None
    return out


def _rel(page):
    return str(page.relative_to(ROOT))


def test_pages_are_found():
    """The pages this test reads exist (a renamed docs folder would make it pass vacuously)."""
    names = {_rel(p) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/python.md", "docs/aclnn.md"} <= names
    assert all(p.exists() for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_fences_are_runnable_or_say_why_not(page):
    """Every block is python or console (or a display), a skip says why, and a console block
    has commands."""
    for lang, code, skip, line in blocks(page):
        where = f"{_rel(page)}:{line}"
        assert lang not in REFUSED, f"{where}: a ```{lang} block: use ```console with `$ ` prompts (or ```python)"
        assert lang, f"{where}: a fence without a language: say python, console or text"
        if skip is not None:
            assert lang in RUNNABLE, f"{where}: a skip marker before a ```{lang} block, which never runs"
            assert len(skip.split()) >= 3, f"{where}: say why the block is skipped and what runs it instead"
        if lang == "console":
            assert commands(code), f"{where}: a console block without a `$ ` command"


def _env(tmp_path):
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    env["MPLBACKEND"] = "Agg"
    env["DOCS_TEST_TMP"] = str(tmp_path)
    return env


@pytest.mark.parametrize("page", [p for p in PAGES if any(lang == "python" and skip is None
                                                         for lang, _, skip, _ in blocks(p))], ids=_rel)
def test_python_blocks_run(page, tmp_path):
    """The page's python blocks, in order, in one interpreter, from the repository root."""
    code = "\n\n".join(f"# --- {_rel(page)}:{line}\n{c}" for lang, c, skip, line in blocks(page)
                       if lang == "python" and skip is None)
    script = tmp_path / "page.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{_rel(page)}'s python blocks failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


@pytest.mark.parametrize("page", [p for p in PAGES if any(lang == "console" and skip is None
                                                         for lang, _, skip, _ in blocks(p))], ids=_rel)
def test_console_blocks_run(page, tmp_path):
    """Each command of the page's console blocks exits 0, from the repository root."""
    for lang, code, skip, line in blocks(page):
        if lang != "console" or skip is not None:
            continue
        for cmd in commands(code):
            r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, (f"{_rel(page)}:{line}: `{cmd}` exited {r.returncode}:\n"
                                       f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
