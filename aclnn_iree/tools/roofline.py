"""`aclnn-iree bench --roofline`: how close the CPU grid sampler is to its floor.

The grid sampler's work per output point is coordinate arithmetic (unnormalise, pad,
floor, weights, masks: vectorised over 8 points) and, per block of 8 channels, the taps:
dx as one read-modify-write of a slot vector per tap (channels interleaved), the grid
gradient as one slot load per tap and a few FMAs.  With few channels that is far more
instructions than bytes, so the floor is the core's issue rate, not DRAM.  This module
takes the two floors of each grid case on this CPU:

- **compute**: the instructions the compiler emitted for each part of `@block_pass`
  and `@dgrid_final` (the x86 assembly of the very module the call runs, parts found by
  the MLIR source lines the assembly's `.loc` entries point at), through LLVM's machine
  code analyser (`llvm-mca -mcpu=native`, or the CPU ACLNN_IREE_CPU_ARCH names): its block reciprocal throughput is the cycles
  one pass of the part needs when every load hits L1 and no dependency waits, the
  ceiling of a roofline.  Times the part's trip count for the case, per output point.
- **memory**: the compulsory bytes (inputs read once, outputs written once) over the
  copy bandwidth measured in the same run.

and sets them beside the measured phase-2 time in core-cycles per output point (time ×
threads × the CPU's clock as /proc/cpuinfo reports it).  measured / floor says how much
is lost to cache misses, store-to-load waits and dependency chains.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import tempfile

from ..compiler.specs import GRID_DX_CHANNEL_BLOCK
from ..compiler.targets import CPU_ARCH_ENV
from ..ops.grid_sampler import OPERATOR

__all__ = ["PARTS", "Part", "kernel_assembly", "part_lines", "pixel_width", "part_instructions", "throughput_cycles",
           "case_roofline", "mca_cpu", "run_roofline"]

CHANNEL_BLOCK = GRID_DX_CHANNEL_BLOCK  # channels per slot vector
LANES = 8  # points per coordinate vector (the template's `lanes`)


@dataclasses.dataclass(frozen=True)
class Part:
    """A part of the CPU kernel: where it starts and ends in the rendered MLIR (the first
    line matching `start` after `after` in function `func`, up to the line before the first
    match of `end` after it) and how often it runs: `per` is "point" (each output point
    and channel block), "group" (each 8 points of a row and block), "image_group" (each 8
    points of a row, once per image) or "pixel8" (each 8 input pixels and block); `modes`:
    the interpolation modes that have it (empty: all); `form`: the grid gradient's form
    that has it, "slots" (the fused pass's partial sums) or "points" (`<kernel>_points`,
    few channels: point-parallel in the same pass), or "" (both)."""

    name: str
    func: str
    after: str
    start: str
    end: str
    per: str
    needs: str  # "dx", "dgrid" or "any": the gradient the part computes
    modes: tuple = ()
    form: str = ""


PARTS = (
    Part("slot fill (input, interleaved)", "block_pass", r"scf\.for %l = %wid", r"scf\.if %with_dg \{",
         r"scf\.for %pb0 =", "pixel8", "dgrid", form="slots"),
    Part("coordinates (per 8 points)", "block_pass", r"scf\.for %i = %c0 to %Ho", r"%jrem = ",
         r"scf\.for %jl = ", "group", "any"),
    Part("nearest: coordinates to the table (per 8 points, once per image)", "block_pass",
         r"scf\.for %i = %c0 to %Ho", r"scf\.if %need_coords \{", r"// grad_output streams in", "image_group", "dx",
         ("nearest",)),
    Part("dx taps", "block_pass", r"scf\.for %jl = ", r"scf\.for %jl = ",
         r"scf\.if %with_dg \{|^      scf\.if %with_dx \{", "point", "dx"),
    Part("grid-gradient taps", "block_pass", r"scf\.for %jl = ", r"scf\.if %with_dg \{",
         r"scf\.if %pg_now \{", "point", "dgrid", form="slots"),
    Part("grid gradient, point-parallel (per 8 points)", "block_pass", r"scf\.for %jl = ", r"scf\.if %pg_now \{",
         r"^      scf\.if %with_dx \{", "group", "dgrid", form="points"),
    Part("slot to dx (transpose)", "block_pass", r"scf\.for %jl = ", r"^      scf\.if %with_dx \{",
         r"^      return", "pixel8", "dx"),
    Part("grid gradient: block sums", "dgrid_final", r"scf\.if %use_part \{", r"scf\.for %j = %c0 to %Wo",
         r"\} else \{", "point", "dgrid", form="slots"),
)


def kernel_assembly(spec, workdir: str) -> tuple:
    """(MLIR source lines, x86 assembly text) of the llvm-cpu module of GridSamplerSpec
    `spec` for this machine's CPU, compiled in `workdir` with IREE's executable
    intermediates kept.  Raises compiler.compile.CompileError / CompilerMissing."""
    from ..compiler import targets
    from ..compiler.compile import compile_file
    from ..compiler.render import render
    target = targets.target_for_driver("local-task")
    path = os.path.join(workdir, "module.mlir")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(spec, target))
    compile_file(path, tuple(target.flags) + (f"--iree-hal-dump-executable-intermediates-to={workdir}",))
    (asm,) = glob.glob(os.path.join(workdir, "*.s"))
    with open(path, encoding="utf-8") as f, open(asm, encoding="utf-8") as g:
        return f.read().split("\n"), g.read()


def _function_span(lines, func: str) -> tuple:
    start = next((i for i, text in enumerate(lines) if re.search(rf"func\.func @{func}\(", text)), None)
    if start is None:
        raise ValueError(f"no function @{func} in the module")
    end = next((i for i in range(start + 1, len(lines)) if re.search(r"func\.func @", lines[i])), len(lines))
    return start, end


def part_lines(mlir_lines, part: Part, full_blocks: bool = True, width: int = CHANNEL_BLOCK) -> list:
    """The 1-based MLIR source lines of `part`, less the masked forms' branches (cold) and
    the dx taps' forms for slot pixels other than `width` lanes (pixel_width).  Raises
    ValueError when the template no longer has the markers (then PARTS needs updating)."""
    lo, hi = _function_span(mlir_lines, part.func)

    def find(pattern, frm):
        for i in range(frm, hi):
            if re.search(pattern, mlir_lines[i]):
                return i
        raise ValueError(f"{part.name}: no line matching {pattern!r} in @{part.func}")

    first = find(part.start, find(part.after, lo))
    last = find(part.end, first + 1)
    cold = _cold_lines(mlir_lines, first, last, full_blocks, width)
    return [n + 1 for n in range(first, last) if n not in cold]


# The scf.if conditions of the unmasked fast paths (templates/grid_sampler_2d_backward/cpu_block_pass.mlir.j2 and
# common.store_vec / load_vec): their else branches, the masked forms, run only at a slot's or
# a row's end, and the packed slot pixels (%exact's else branch) only where the host found no
# room for the aligned ones.  (slot_load's outer branch on cw == 8 is counted on both sides: a
# case runs one.)
_FAST_IF = re.compile(r"^\s*(?:%\w+ = )?scf\.if %(v_\w+_u|xf\d+|\w+_sf|\w+_lf|\w+_lin|\w+_fast|exact)(?: -> \(.*\))? \{")


# ... and those whose then branch is the rare one: nearest computes a point's coordinates in
# the first block of each image it meets (templates: nearest_table), the other blocks read
# the table (a part that starts at such an if counts its body); the point-parallel grid
# gradient reads a group's taps with vector loads only where they are consecutive pixels
# (%contig: a smooth grid; the bench's grids are random, so its gathers run).
_RARE_IF = re.compile(r"^\s*(?:%[\w:]+ = )?scf\.if %(?:need_coords|contig)(?: -> \(.*\))? \{")

# ... and the dx taps' branch on the slot pixel's width (islot_points: `scf.if %cs_is<w>`, the
# narrower forms in its else branch): a case runs the one form of its width.
_WIDTH_IF = re.compile(r"^\s*scf\.if %cs_is(\d+) \{")


def pixel_width(channels: int) -> int:
    """The lanes of a slot pixel for `channels` channels (the template's %pxs): the power of
    two at or above min(channels, CHANNEL_BLOCK)."""
    w = 1
    while w < min(channels, CHANNEL_BLOCK):
        w *= 2
    return w


def _then_end(mlir_lines, i: int, last: int) -> int:
    """The line of the brace that closes the region opened at the end of line i (by brace
    depth: a region's body is not indented uniformly, nested macros keep their own)."""
    depth = 1
    for k in range(i + 1, last):
        for ch in mlir_lines[k]:
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                return k
    raise ValueError(f"no end of the region opened at line {i + 1}")


def _cold_lines(mlir_lines, first: int, last: int, full_blocks: bool = True, width: int = CHANNEL_BLOCK) -> set:
    """0-based lines in [first, last) of the else branches of the fast-path ifs and of the
    then branches of the rare ones.  Without `full_blocks` (fewer than 8 channels: no
    block has 8), the `..._fast` branches, whole groups of full blocks, are the cold ones.
    Of the width branches, all but the `width` form."""
    cold = set()
    for i in range(first, last):
        w = _WIDTH_IF.match(mlir_lines[i])
        if w:
            j = _then_end(mlir_lines, i, last)
            if int(w.group(1)) > width:
                cold.update(range(i + 1, j))
            elif mlir_lines[j].strip() == "} else {":
                cold.update(range(j + 1, _then_end(mlir_lines, j, last)))
            continue
        if _RARE_IF.match(mlir_lines[i]) and i > first:
            cold.update(range(i + 1, _then_end(mlir_lines, i, last)))
            continue
        m = _FAST_IF.match(mlir_lines[i])
        if not m:
            continue
        j = _then_end(mlir_lines, i, last)
        if not full_blocks and m.group(1).endswith("_fast"):
            cold.update(range(i + 1, j))
        elif mlir_lines[j].strip() == "} else {":
            cold.update(range(j + 1, _then_end(mlir_lines, j, last)))
    return cold


_LOC = re.compile(r"^\s+\.loc\s+\d+\s+(\d+)\s")
_INSN = re.compile(r"^\t[a-z]")


def part_instructions(asm: str, func: str, lines) -> list:
    """The instructions of assembly function `func` whose source line (the last `.loc`
    before them; `.loc ... 0`, a line-less instruction such as a spill, keeps the line
    before it) lies in `lines`, in program order."""
    text = asm.split("\n")
    start = text.index(f"{func}:")
    lines, out, line = set(lines), [], 0
    for t in text[start + 1:]:
        if t.startswith(".Lfunc_end"):
            break
        m = _LOC.match(t)
        if m:
            line = int(m.group(1)) or line
        elif _INSN.match(t) and line in lines:
            out.append(t.strip())
    return out


def mca_cpu() -> str:
    """The CPU llvm-mca models: the one the CPU kernels are compiled for, i.e. the LLVM CPU
    named by ACLNN_IREE_CPU_ARCH, or "native" (this machine's) when it is unset."""
    from ..compiler import targets
    arch = targets.target_for_driver("local-task").arch
    return "native" if arch == "host" else arch


def _mca_version() -> str:
    proc = subprocess.run(["llvm-mca", "--version"], capture_output=True, text=True)
    found = re.search(r"LLVM version ([\w.]+)", proc.stdout)
    host = re.search(r"Host CPU: (\S+)", proc.stdout)
    return f"llvm-mca {found.group(1) if found else '(unknown version)'}", host.group(1) if host else "?"


def throughput_cycles(instructions, mcpu: str = "native") -> float:
    """llvm-mca's block reciprocal throughput (cycles per pass, ports and issue width only)
    of `instructions` on CPU `mcpu` (an LLVM CPU name; "native": this one).  Raises
    RuntimeError, in one line, when llvm-mca fails, does not know `mcpu` or cannot model an
    instruction (an llvm-mca older than the compiler's LLVM meets CPUs and instruction sets
    it has no model of: LLVM 14 reads Zen 4 as Zen 3, without AVX-512)."""
    if not instructions:
        return 0.0
    proc = subprocess.run(["llvm-mca", f"-mcpu={mcpu}", "-iterations=100"], input="\n".join(instructions) + "\n",
                          capture_output=True, text=True)
    m = re.search(r"Block RThroughput:\s+([\d.]+)", proc.stdout)
    if "is not a recognized processor" in proc.stderr:
        version, _ = _mca_version()
        raise RuntimeError(f"{version} does not know the CPU {mcpu!r} (an LLVM CPU name, from {CPU_ARCH_ENV})")
    if proc.returncode != 0 or not m:
        bad = re.search(r"note: instruction:\s*(.+)", proc.stderr)
        if "unsupported instruction" in proc.stderr and bad:
            version, host = _mca_version()
            cpu = f"this CPU (which it reads as {host})" if mcpu == "native" else f"CPU {mcpu}"
            raise RuntimeError(
                f"{version} has no model of {' '.join(bad.group(1).split())!r} on {cpu}, as the kernel compiled for it "
                f"uses: take an llvm-mca as new as the compiler's LLVM, or set {CPU_ARCH_ENV} to a CPU this one "
                f"models (e.g. {host}) to build, time and analyse the kernels for that CPU")
        raise RuntimeError(f"llvm-mca failed: {(proc.stderr or proc.stdout).strip().splitlines()[:1]}")
    return float(m.group(1))


def _trips(part: Part, shape) -> int:
    N, C, H, W, Ho, Wo = shape
    blocks = -(-C // CHANNEL_BLOCK)
    if part.func == "dgrid_final":
        return N * Ho * Wo
    if part.per == "image_group":
        return N * Ho * -(-Wo // LANES)
    per = {"point": Ho * Wo, "group": Ho * -(-Wo // LANES), "pixel8": -(-H * W // LANES)}[part.per]
    return N * blocks * per


def parts_run(spec, channels: int) -> list:
    """The PARTS a call with both outputs of GridSamplerSpec `spec` and `channels` channels
    runs: nearest has no grid gradient, only nearest a table; the grid gradient's form is
    the one GridSamplerSpec.function_name picks for the channels."""
    form = "points" if spec.function_name((True, True), channels=channels).endswith("_points") else "slots"
    mode = spec.interpolation_mode
    return [p for p in PARTS if not (p.needs == "dgrid" and mode == "nearest") and not (p.modes and mode not in p.modes)
            and p.form in ("", form)]


def case_roofline(case, spec, workdir: str) -> list:
    """[(part name, cycles per pass, cycles per output point of `case`)] for the parts
    bench Case `case` (both outputs) runs."""
    mlir, asm = kernel_assembly(spec, workdir)
    N, C, H, W, Ho, Wo = case.shape
    out = []
    for part in parts_run(spec, C):
        lines = part_lines(mlir, part, full_blocks=C >= CHANNEL_BLOCK, width=pixel_width(C))
        cyc = throughput_cycles(part_instructions(asm, part.func, lines), mca_cpu())
        out.append((part.name, cyc, cyc * _trips(part, case.shape) / (N * Ho * Wo)))
    return out


def cpu_mhz() -> float:
    """The mean clock /proc/cpuinfo reports (a virtual machine's is nominal); 0 if unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            mhz = [float(v) for v in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", f.read(), re.M)]
    except OSError:
        return 0.0
    return sum(mhz) / len(mhz) if mhz else 0.0


def missing() -> str | None:
    """What run_roofline needs and this machine lacks, in words; None when nothing."""
    if shutil.which("llvm-mca") is None:
        return "LLVM's llvm-mca on PATH (apt-get install llvm)"
    if not cpu_mhz():
        return "the CPU clock, and /proc/cpuinfo has no 'cpu MHz'"
    return None


def run_roofline(threads: int, repeats: int, quick: bool = False) -> list:
    """Times each grid case of the bench (the quick subset with `quick`) in phase 2 on the
    CPU with `threads` task workers and prints, per case and part, the compute floor beside
    the measured core-cycles per output point.  Returns the rows (dicts).  Raises
    RuntimeError naming what is missing (see missing()), CompileError from the compiler."""
    import numpy as np
    from . import bench
    from ..compiler import specs
    from ..runtime.device import Device
    lack = missing()
    if lack:
        raise RuntimeError(f"--roofline needs {lack}")
    mhz = cpu_mhz()
    device = Device("local-task", threads=threads)
    bw = bench.copy_bandwidth()  # GB/s
    rows = []
    rng = np.random.default_rng(0)
    for case in (c for c in bench.CASES if c.op == OPERATOR.name and (not quick or c.name in bench.QUICK)):
        spec = specs.GridSamplerSpec(specs.INTERPOLATION_MODES[case.mode], specs.PADDING_MODES[case.padding],
                                     case.align_corners, "float32")
        with tempfile.TemporaryDirectory() as d:  # first: llvm-mca may not read this CPU's code
            parts = case_roofline(case, spec, d)
        run, _, _ = bench._phase2(case, bench._inputs(case, rng), device)
        t = bench._median_time(run, repeats)
        N, C, H, W, Ho, Wo = case.shape
        points = N * Ho * Wo
        measured = t * threads * mhz * 1e6 / points
        floor = sum(p[2] for p in parts)
        mem = bench.compulsory_bytes(case) / (bw * 1e9) * threads * mhz * 1e6 / points
        rows.append({"case": case.name, "channels": C, "ms": t * 1e3, "measured": measured, "compute_floor": floor,
                     "memory_floor": mem, "parts": parts})
    _print(rows, mhz, threads, bw)
    return rows


def _print(rows, mhz, threads, bw):
    print(f"\nGrid sampler roofline (both outputs, float32; {threads} threads; clock {mhz:.0f} MHz as "
          f"/proc/cpuinfo says; copy bandwidth {bw:.1f} GB/s), core-cycles per output point:")
    print("| case | C | phase 2 ms | measured | compute floor | memory floor | measured / floor |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        floor = max(r["compute_floor"], r["memory_floor"])
        print(f"| {r['case']} | {r['channels']} | {r['ms']:.2f} | {r['measured']:.0f} | {r['compute_floor']:.0f} | "
              f"{r['memory_floor']:.1f} | {r['measured'] / floor:.2f} |")
    print("\nThe compute floor by part (llvm-mca block throughput, cycles per pass -> per output point):")
    for r in rows:
        print(f"  {r['case']}: " + "; ".join(f"{n} {c:.1f} -> {p:.1f}" for n, c, p in r["parts"]))
