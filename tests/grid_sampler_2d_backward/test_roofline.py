"""`aclnn-iree bench --roofline` (aclnn_iree/roofline.py): the parts of the CPU grid kernel it
finds in the rendered MLIR and in the compiled assembly, and llvm-mca's throughput of them.

Oracles: the template's own text (each part holds the ops that define it; the masked
fallbacks of the unmasked fast paths are left out as cold) and the x86 instructions the
compiler emitted (the dx taps' hot path stores with plain vector stores, not AVX2's
microcoded masked store: a speed-up docs/kernel-design.md describes, kept by this test).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from aclnn_iree.tools import roofline
from aclnn_iree.compiler import specs, targets
from aclnn_iree.compiler.compile import compiler_available
from aclnn_iree.compiler.render import render

CPU = targets.get_target("llvm-cpu")
# An op that defines each part (found in its lines) and one that must not be in them.
DEFINING = {
    "slot fill (input, interleaved)": r"%xe\d+ = vector\.extract",
    "coordinates (per 8 points)": r"%gt_t = vector\.transpose",
    "nearest: coordinates to the table (per 8 points, once per image)": r"%nt_v = arith\.select",
    "dx taps": r"vector\.store %v_\w+_s, %islot",
    "grid-gradient taps": r"%l_\w+ = memref\.load %ltab_f",
    "slot to dx (transpose)": r"%to_t = vector\.transpose",
    "grid gradient: block sums": r"%nsx = arith\.addf",
    "grid gradient, point-parallel (per 8 points)": r"vector\.gather %inp1",
}


def _mlir(mode, pad="zeros"):
    return render(specs.GridSamplerSpec(mode, pad, False, "float32"), CPU).split("\n")


@pytest.mark.parametrize("mode", specs.INTERPOLATION_MODES)
def test_every_part_is_found_and_holds_its_ops(mode):
    mlir = _mlir(mode, "reflection")
    for part in roofline.PARTS:
        if (part.needs == "dgrid" and mode == "nearest") or (part.modes and mode not in part.modes):
            with pytest.raises(ValueError):  # nearest has no grid gradient, the others no table
                roofline.part_lines(mlir, part)
            continue
        lines = roofline.part_lines(mlir, part)
        text = [mlir[n - 1] for n in lines]
        assert any(re.search(DEFINING[part.name], t) for t in text), part.name
        # No line of another function, and no masked fallback of a fast path.
        assert not any("func.func" in t for t in text), part.name
        if part.name == "coordinates (per 8 points)" and mode == "nearest":  # the table's job
            assert not any("%pxr_cc" in t for t in text)
        if part.name == "dx taps":  # no masks: a slot pixel's lanes are whole vectors
            assert not any("vector.maskedstore %islot" in t or "vector.maskedload %islot" in t for t in text)
        if part.name == "grid-gradient taps":  # the slot form's taps only
            assert not any("%pg_now" in t or "vector.gather" in t for t in text)
        if part.name.startswith("grid gradient, point-parallel"):  # gathers: the bench's grids are random
            assert not any(re.search(r"%\w+_s = vector\.load %inp\[", t) for t in text)


def test_the_parts_follow_the_grid_gradients_form():
    """Few channels (SPLIT_POINTS_CHANNELS, `<kernel>_points`) run the point-parallel grid
    gradient inside the block pass, no slot fill, slot taps or block sums; many channels the
    reverse; nearest neither."""
    names = lambda mode, c: {p.name for p in roofline.parts_run(specs.GridSamplerSpec(mode, "zeros", False, "float32"), c)}
    point, slot = "grid gradient, point-parallel (per 8 points)", {"slot fill (input, interleaved)", "grid-gradient taps",
                                                                 "grid gradient: block sums"}
    few = min(specs.SPLIT_POINTS_CHANNELS)
    assert point in names("bilinear", few) and not slot & names("bilinear", few)
    assert point not in names("bicubic", 64) and slot <= names("bicubic", 64)
    assert point not in names("nearest", few) and not slot & names("nearest", few)


def test_slot_to_dx_counts_the_form_the_channels_take():
    """With 8 channels or more a group of a full block takes the whole-vector form; with fewer
    no block is full, and the per-lane form is the one that runs."""
    mlir = _mlir("bilinear")
    part = next(p for p in roofline.PARTS if p.name == "slot to dx (transpose)")
    full = [mlir[n - 1] for n in roofline.part_lines(mlir, part)]
    few = [mlir[n - 1] for n in roofline.part_lines(mlir, part, full_blocks=False)]
    assert any("%tf_r0 = vector.load %islot" in t for t in full)
    assert not any("%tol0_l = vector.load %islot" in t for t in full)
    assert any("%tol0_l = vector.load %islot" in t for t in few)
    assert not any("%tf_r0 = vector.load %islot" in t for t in few)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_dx_taps_count_the_form_of_the_slot_pixel_width(mode):
    """The dx taps have a form per slot pixel width (1, 2, 4 or 8 lanes: the power of two
    at or above the block's channels); a case counts the one its channels run, whose slot
    accesses are all of that width."""
    mlir = _mlir(mode)
    part = next(p for p in roofline.PARTS if p.name == "dx taps")
    assert [roofline.pixel_width(c) for c in (1, 2, 3, 4, 5, 7, 8, 9, 64)] == [1, 2, 4, 4, 8, 8, 8, 8, 8]
    for width in (1, 2, 4, 8):
        text = [mlir[n - 1] for n in roofline.part_lines(mlir, part, full_blocks=width == 8, width=width)]
        rmw = [t for t in text if re.search(r"vector\.(load|store) .*%islot", t)]
        taps = 16 if mode == "bicubic" else 1 if mode == "nearest" else 4
        assert len(rmw) == 2 * taps, (width, rmw)
        assert all(t.endswith(f"vector<{width}x!acc>") for t in rmw), (width, rmw)


def test_a_template_without_the_markers_is_an_error():
    mlir = [line.replace("scf.for %jl", "scf.for %jj") for line in _mlir("bilinear")]
    with pytest.raises(ValueError, match="dx taps"):
        roofline.part_lines(mlir, next(p for p in roofline.PARTS if p.name == "dx taps"))


@pytest.mark.skipif(shutil.which("llvm-mca") is None, reason="no llvm-mca here (apt-get install llvm)")
def test_llvm_mca_throughput_of_known_code():
    # Independent adds on one register pair: bound by the FP-add pipes, so n of them take
    # n / pipes cycles; twice as many take twice as long.
    one = roofline.throughput_cycles(["vaddps %ymm0, %ymm1, %ymm2"] * 4)
    two = roofline.throughput_cycles(["vaddps %ymm0, %ymm1, %ymm2"] * 8)
    assert 0 < one and two == pytest.approx(2 * one)
    with pytest.raises(RuntimeError, match="llvm-mca"):
        roofline.throughput_cycles(["not_an_instruction %zz9"])


@pytest.mark.skipif(shutil.which("llvm-mca") is None or not compiler_available(),
                    reason="needs llvm-mca and iree-base-compiler")
def test_dx_taps_store_without_masked_stores(tmp_path):
    spec = specs.GridSamplerSpec("bilinear", "reflection", False, "float32")
    mlir, asm = roofline.kernel_assembly(spec, str(tmp_path))
    part = next(p for p in roofline.PARTS if p.name == "dx taps")
    ins = roofline.part_instructions(asm, part.func, roofline.part_lines(mlir, part))
    # A vector store per corner: plain, or masked by an AVX-512 mask register (a store like
    # any other there); never AVX2's vmaskmov, which Zen 1-3 run as microcode.
    stores = [i for i in ins if re.match(r"vmov\w*\s+%[xyz]mm\d+, .*\)( \{%k\d\})?$", i)]
    assert len(stores) >= 4, ins  # one per corner
    assert not [i for i in ins if re.match(r"vmaskmov\w*\s+%[xy]mm\d+, %[xy]mm\d+, .*\)$", i)], ins
    assert 0 < roofline.throughput_cycles(ins) < 40


def test_cli_roofline_rejects_options_it_does_not_take():
    proc = subprocess.run([sys.executable, "-m", "aclnn_iree", "bench", "--roofline", "--peers"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--roofline" in lines[0] and "Traceback" not in proc.stderr


def test_llvm_mca_models_the_cpu_the_kernels_are_compiled_for(monkeypatch):
    monkeypatch.delenv(targets.CPU_ARCH_ENV, raising=False)
    assert roofline.mca_cpu() == "native"
    monkeypatch.setenv(targets.CPU_ARCH_ENV, "x86-64-v3")
    assert roofline.mca_cpu() == "x86-64-v3"


@pytest.mark.skipif(shutil.which("llvm-mca") is None, reason="no llvm-mca here (apt-get install llvm)")
def test_llvm_mca_without_a_model_says_so_in_one_line():
    # Zen 3 has no AVX-512: no llvm-mca has a Zen 3 model of a zmm instruction.
    with pytest.raises(RuntimeError, match=r"has no model of 'vaddps %zmm0, %zmm1, %zmm2' on CPU znver3") as e:
        roofline.throughput_cycles(["vaddps %zmm0, %zmm1, %zmm2"], "znver3")
    assert "\n" not in str(e.value) and targets.CPU_ARCH_ENV in str(e.value)
    with pytest.raises(RuntimeError, match="does not know the CPU 'no-such-cpu'"):
        roofline.throughput_cycles(["vaddps %ymm0, %ymm1, %ymm2"], "no-such-cpu")


@pytest.mark.skipif(not compiler_available(), reason="needs iree-base-compiler")
def test_cli_roofline_where_llvm_mca_cannot_read_the_kernel(tmp_path):
    # An llvm-mca older than the CPU (LLVM 14 on Zen 4 reads AVX-512 code as Zen 3's and
    # fails): one line naming the instruction and the way out, no traceback.
    fake = tmp_path / "llvm-mca"
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = --version ]; then echo '  LLVM version 14.0.6'; echo '  Host CPU: znver3'; exit 0; fi\n"
                    "cat >/dev/null\n"
                    "echo 'error: found an unsupported instruction in the input assembly sequence.' >&2\n"
                    "printf 'note: instruction: \\tvpaddd\\t%%zmm4, %%zmm4, %%zmm4\\n' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    env.pop(targets.CPU_ARCH_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "aclnn_iree", "bench", "--roofline", "--quick", "--repeats", "1"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "llvm-mca 14.0.6 has no model of 'vpaddd %zmm4, %zmm4, %zmm4'" in lines[0]
    assert "reads as znver3" in lines[0] and targets.CPU_ARCH_ENV in lines[0]
