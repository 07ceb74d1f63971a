"""The operator registry (aclnn_iree/ops/registry.py): every layer iterates it, and no code
outside an operator's own files switches on an operator's name."""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from aclnn_iree.ops import Operator
from aclnn_iree.ops.registry import OPERATORS, get
from aclnn_iree.compiler.specs import all_specs

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for folder in ("aclnn_iree", "compiler", "runtime") for p in (REPO / folder).rglob("*.py"))
# The short names the layers once switched on ("grid", "upsample", ...): as a comparison,
# a mapping key or a subscript they are a switch whatever the file.
ALIASES = {"grid", "upsample", "upsample_same", "gs", "up"}


def _module_file(module: str) -> pathlib.Path:
    return pathlib.Path(importlib.import_module(module).__file__).resolve()


def _own_files(op: Operator) -> set:
    """The files that are the operator's own: its module (check, bind, description), its torch,
    bench and roofline modules."""
    files = {pathlib.Path(importlib.import_module(op.check.__module__).__file__).resolve()}
    files |= {_module_file(getattr(op, part)) for part in ("torch", "bench", "roofline") if getattr(op, part)}
    return files


def test_each_operator_is_complete():
    assert OPERATORS and len({op.name for op in OPERATORS}) == len(OPERATORS)
    for op in OPERATORS:
        assert get(op.name) is op
        assert op.spec.op == op.name and op.aclnn_name.startswith("aclnn")
        assert callable(op.check) and callable(op.bind) and callable(op.reference)
        assert "" in op.inline_work and all(isinstance(v, int) for v in op.inline_work.values())
        specs = list(all_specs([op.name]))
        assert specs and all(type(s) is op.spec for s in specs)
        assert all(s.template.startswith(op.name + "/") for s in specs)
        bench = op.load("bench")
        assert bench.CASES and all(c.op == op.name for c in bench.CASES) and bench.QUICK <= {c.name for c in bench.CASES}
        for fn in ("inputs", "compulsory_bytes", "pythonic", "phase2", "torch_op", "torch_compile", "jax_op"):
            assert callable(getattr(bench, fn)), (op.name, fn)
        assert bench.torch_step is None or callable(bench.torch_step)
    with pytest.raises(KeyError, match="known: "):
        get("no_such_op")


def test_the_layers_iterate_the_registry():
    from aclnn_iree import cli
    from aclnn_iree.tools import bench
    names = [op.name for op in OPERATORS]
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for command in ("list", "build"):
        assert next(a for a in sub[command]._actions if a.dest == "op").choices == names
    assert list(bench.BENCHES) == names
    assert {c.op for c in bench.CASES} == set(names)
    assert {s.op for s in all_specs()} == set(names)


def test_torch_layer_iterates_the_registry():
    pytest.importorskip("torch")
    import aclnn_iree.torch  # noqa: F401 - registers every operator's ops
    for op in OPERATORS:
        overrides = op.load("torch").ATEN_OVERRIDES
        assert f"aten::{op.name}" in overrides and all(callable(k) for k in overrides.values())


def _switches(path: pathlib.Path, names: set) -> list:
    """(line, literal) of every operator name used as a string outside `__all__` (and outside a
    spec class's `op = ...`), and of every alias used as a comparison, key or subscript."""
    tree = ast.parse(path.read_text())
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("__all__", "op")
                                                for t in node.targets):
            allowed |= {id(n) for n in ast.walk(node.value)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in allowed:
            if node.value in names or node.value.split("::")[-1] in names and node.value.startswith("aten::"):
                found.append((node.lineno, node.value))
        keys = []
        if isinstance(node, ast.Compare):
            keys = [node.left, *node.comparators]
            keys += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript):
            keys = [node.slice]
        found += [(k.lineno, k.value) for k in keys
                  if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value in ALIASES]
    return found


def test_no_operator_name_switch_outside_the_operators_own_files():
    names = {op.name for op in OPERATORS}
    own = set().union(*(_own_files(op) for op in OPERATORS))
    bad = {str(p.relative_to(REPO)): s for p in SOURCES if p.resolve() not in own
           for s in [_switches(p, names)] if s}
    assert not bad, f"operator names switched on outside the operators' own files: {bad}"


def test_the_switch_finder_finds_switches(tmp_path):
    """The check above can fail: each kind of switch it looks for is found."""
    src = tmp_path / "x.py"
    src.write_text('a = {"grid": 1}\nif op == "upsample":\n    pass\nb = c["gs"]\n'
                   'd = "grid_sampler_2d_backward"\ne = "aten::upsample_bilinear2d_backward"\n'
                   '__all__ = ["grid_sampler_2d_backward"]\n')
    found = _switches(src, {op.name for op in OPERATORS})
    assert sorted(line for line, _ in found) == [1, 2, 4, 5, 6]


def _imports(path: pathlib.Path) -> set:
    """Every module `path` imports (relative imports resolved against its package)."""
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("compiler", "runtime"):
        parts = ["aclnn_iree"] + parts
    package = parts[:-1]  # a module's package, or an __init__'s own
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return found


@pytest.mark.parametrize("layer", ["aclnn_iree/core", "aclnn_iree/ops", "compiler", "runtime"])
def test_the_library_imports_neither_the_tools_nor_torch(layer):
    """The layers below the PyTorch layer and the tools stand on their own: the core, the
    operators, the compiler and the runtime import no tool (aclnn_iree.tools: the benchmark,
    demos) and not torch (an Operator names its torch and bench modules; the layers above
    load them)."""
    for path in sorted((REPO / layer).rglob("*.py")):
        bad = {m for m in _imports(path) if m.startswith(("aclnn_iree.tools", "aclnn_iree.torch", "torch"))
               or m == "torch"}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_public_import_paths():
    """The paths users import keep working: the aclnn layer is one module under both names."""
    import aclnn_iree
    import aclnn_iree.aclnn as public
    from aclnn_iree import aclnn
    from aclnn_iree.core import aclnn as core
    assert public is core and aclnn is core and aclnn_iree.aclnn is core
    assert callable(aclnn_iree.grid_sampler_2d_backward) and callable(aclnn_iree.upsample_bilinear2d_backward)
    namespace = {}
    exec("from aclnn_iree.aclnn import *", namespace)
    assert {"aclnnGridSampler2DBackward", "aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize",
            "aclCreateTensor"} <= set(namespace)
    from aclnn_iree.cli import main  # noqa: F401 - the console script's entry point
