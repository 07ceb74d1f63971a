"""What a compiled module exports, read from its reflection: the functions, their ABI
model and their VM-level arguments (the manifest's "functions" and "exports"), and the
parser of `iree.abi.declaration` strings that reads them."""
from __future__ import annotations

__all__ = ["module_exports", "parse_declaration"]


def _split_top(text: str, sep: str = ",") -> list:
    """Splits `text` at `sep` outside (), <>, {} and [] (for MLIR argument lists)."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<{[":
            depth += 1
        elif ch in ")>}]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _parse_values(text: str) -> list:
    """`%a: T {attrs}, ...` -> [{"name", "type", "attributes"}] (attributes "" when none)."""
    out = []
    for item in _split_top(text):
        name, _, rest = item.partition(":")
        rest = rest.strip()
        attrs = ""
        if rest.endswith("}") and "{" in rest:
            i = rest.index("{")
            rest, attrs = rest[:i].strip(), rest[i:]
        out.append({"name": name.strip(), "type": rest, "attributes": attrs})
    return out


def parse_declaration(decl: str) -> tuple:
    """(arguments, results) of an `iree.abi.declaration` string, as lists of {"name", "type", "attributes"}."""
    i = decl.index("(")
    depth = 0
    for j in range(i, len(decl)):
        depth += decl[j] == "("
        depth -= decl[j] == ")"
        if depth == 0:
            break
    args = _parse_values(decl[i + 1:j])
    rest = decl[j + 1:].strip()
    results = []
    if rest.startswith("->"):
        rest = rest[2:].strip()
        if rest.startswith("(") and rest.endswith(")"):
            rest = rest[1:-1]
        results = _parse_values(rest)
    return args, results


_FENCES = ["!hal.fence {coarse-fences wait}", "!hal.fence {coarse-fences signal}"]


def module_exports(vmfb: bytes, names) -> tuple:
    """(functions, exports) of a module, read from its reflection.

    functions: exported name -> declaration string (the companion
    `_transients_size` functions carry no reflection; their declaration is
    derived from their entry's).  exports: exported name -> {"abi_model",
    "arguments", "results", "transients_size_function",
    "transients_size_constant"} or, for a companion, {"companion_of",
    "arguments", "results"}; arguments and results are "type {attributes}"
    strings, the arguments being the ones a caller passes at the VM level (with
    the two coarse-fences fences last).
    """
    import iree.runtime as rt
    inst = rt.VmInstance()
    mod = rt.VmModule.copy_buffer(inst, vmfb)
    functions, exports = {}, {}

    def fmt(values):
        return [v["type"] + (f" {v['attributes']}" if v["attributes"] else "") for v in values]

    for n in names:
        f = mod.lookup_function(n)
        if f is None:
            continue
        refl = dict(f.reflection)
        decl = refl.get("iree.abi.declaration", "")
        model = refl.get("iree.abi.model", "")
        try:
            args, results = parse_declaration(decl) if decl else ([], [])
        except ValueError:
            args, results = [], []
        vm_args = fmt(args) + (_FENCES if model == "coarse-fences" else [])
        functions[n] = decl or str(f)
        exports[n] = {"abi_model": model, "arguments": vm_args, "results": fmt(results),
                      "transients_size_function": refl.get("iree.abi.transients.size"),
                      "transients_size_constant": refl.get("iree.abi.transients.size.constant")}
        size_name = refl.get("iree.abi.transients.size") or n + "_transients_size"
        if mod.lookup_function(size_name) is not None:
            sig = ", ".join(f"%arg{i}: {a}" for i, a in enumerate(vm_args))
            functions[size_name] = f"func @{size_name}({sig}) -> i64  (workspace bytes of @{n})"
            exports[size_name] = {"companion_of": n, "arguments": vm_args, "results": ["i64"]}
    return functions, exports
