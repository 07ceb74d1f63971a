"""Rendering of the Jinja2 MLIR templates (no compiler needed, fast).

Every specialisation renders; the exported functions, their ABI attributes and
kernel names are as the runtime expects; the mode / padding / dtype specific code
is present where it should be and absent elsewhere; a misspelt template parameter
fails at render time; coordinates become offsets through 64-bit integers.
"""
from __future__ import annotations

import functools
import importlib
import re
from importlib import resources

import jinja2
import pytest

from aclnn_iree.compiler.targets import get_target
from aclnn_iree.compiler.specs import (DTYPES, INTERPOLATION_MODES, PADDING_MODES, GridSamplerSpec, UpsampleSpec,
                                      GridSampler2dSpec, UpsampleBilinear2dSpec,
                                      all_specs)

render_mod = importlib.import_module("aclnn_iree.compiler.render")

GRID_SPECS = list(all_specs(ops=[GridSamplerSpec.op]))
UPSAMPLE_SPECS = list(all_specs(ops=[UpsampleSpec.op]))


def _has_template(spec) -> bool:
    return resources.files("aclnn_iree.templates").joinpath(spec.template).is_file()


def _need_upsample_template():
    if not _has_template(UPSAMPLE_SPECS[0]):
        pytest.skip(f"templates/{UPSAMPLE_SPECS[0].template} does not exist (yet)")


@functools.lru_cache(maxsize=None)
def rendered(spec) -> str:
    return render_mod.render(spec)


def spec_id(s) -> str:
    return s.kernel_name


# Signature of an exported function: name, arguments, results, attribute dictionary.
FUNC_RE = re.compile(
    r"util\.func public @(?P<name>\w+)\((?P<args>.*?)\)\s*->\s*(?P<res>.*?)\s+attributes\s*\{(?P<attrs>[^}]*)\}",
    re.DOTALL)


def exported_functions(text) -> dict:
    return {m["name"]: m for m in FUNC_RE.finditer(text)}


def _check_exports(spec, text):
    for name in spec.function_names():
        assert f"util.func public @{name}(" in text, name
    funcs = exported_functions(text)
    assert set(funcs) == set(spec.function_names()), "exactly the spec's functions are public"
    for name, m in funcs.items():
        assert 'iree.abi.model = "coarse-fences"' in m["attrs"], name
        assert "iree.abi.transients" in m["args"], name
        assert "iree.abi.output = 0 : index" in m["args"], name
    return funcs


# ----------------------------------------------------------------------------------------
# Every specialisation renders, with the exported functions the runtime calls
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", GRID_SPECS, ids=spec_id)
def test_grid_sampler_spec_renders_with_exports(spec):
    text = rendered(spec)
    funcs = _check_exports(spec, text)
    # The both-gradients function writes two outputs into the caller's buffers, the
    # single-gradient ones one each.
    main = funcs[spec.kernel_name]["args"]
    assert "iree.abi.output = 0 : index" in main and "iree.abi.output = 1 : index" in main
    for suffix in ("_dx", "_dgrid"):
        assert "iree.abi.output = 1 : index" not in funcs[spec.kernel_name + suffix]["args"]
    # 3, and where there is a grid gradient the point-parallel passes: grad_grid alone and
    # both outputs (dx alone, then grad_grid point-parallel)
    n = len(spec.function_names())
    two = 1 if spec.interpolation_mode == "nearest" else 2  # functions writing two outputs
    assert n == (3 if spec.interpolation_mode == "nearest" else 5)
    if two == 2:
        points = funcs[spec.kernel_name + "_points"]["args"]
        assert "iree.abi.output = 0 : index" in points and "iree.abi.output = 1 : index" in points
    assert text.count('iree.abi.model = "coarse-fences"') == n
    assert text.count("iree.abi.transients") == n
    assert text.count("iree.abi.output") == n + two
    assert f"hal.executable.source private @{spec.kernel_name}_exe" in text
    assert "{{" not in text and "{%" not in text and "{#" not in text  # nothing left unrendered


@pytest.mark.parametrize("spec", UPSAMPLE_SPECS, ids=spec_id)
def test_upsample_spec_renders_with_exports(spec):
    _need_upsample_template()
    text = rendered(spec)
    _check_exports(spec, text)
    assert "{{" not in text and "{%" not in text and "{#" not in text


def test_rendering_is_deterministic():
    spec = GridSamplerSpec("bicubic", "reflection", True, "float16")
    assert render_mod.render(spec) == render_mod.render(spec)


# ----------------------------------------------------------------------------------------
# Kernel names
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,name", [
    (("bilinear", "zeros", False, "float32"), "grid_sampler_2d_backward_bilinear_zeros_ac0_f32"),
    (("nearest", "border", True, "float16"), "grid_sampler_2d_backward_nearest_border_ac1_f16"),
    (("bicubic", "reflection", True, "bfloat16"), "grid_sampler_2d_backward_bicubic_reflection_ac1_bf16"),
    (("bilinear", "reflection", False, "float64"), "grid_sampler_2d_backward_bilinear_reflection_ac0_f64"),
])
def test_grid_sampler_kernel_names_exact(args, name):
    spec = GridSamplerSpec(*args)
    assert spec.kernel_name == name
    points = () if args[0] == "nearest" else (name + "_dgrid_points", name + "_points")
    assert spec.function_names() == (name, name + "_dx", name + "_dgrid") + points
    assert spec.function_name((True, True)) == name
    assert spec.function_name((True, False)) == name + "_dx"
    assert spec.function_name((False, True)) == name + "_dgrid"
    # grad_grid alone with few channels: the point-parallel pass on CPUs
    assert spec.function_name((False, True), channels=8) == (name + "_dgrid" if not points else points[0])
    assert spec.function_name((False, True), channels=9) == name + "_dgrid"
    # ... and, bilinear, with few grad_output elements
    small = name + "_dgrid_points" if args[0] == "bilinear" else name + "_dgrid"
    assert spec.function_name((False, True), channels=30, elements=262144) == small
    assert spec.function_name((False, True), channels=30, elements=262145) == name + "_dgrid"
    assert spec.function_name((True, True), channels=1) == name
    # both gradients with 3-6 channels: dx alone, then the point-parallel grad_grid pass
    for c in (3, 6):
        assert spec.function_name((True, True), channels=c) == (name if not points else points[1])
    for c in (2, 7):
        assert spec.function_name((True, True), channels=c) == name
    assert spec.function_name((True, False), channels=3) == name + "_dx"


@pytest.mark.parametrize("args,name", [
    ((False, "float32", "NCHW"), "upsample_bilinear2d_backward_nchw_ac0_f32"),
    ((True, "bfloat16", "NHWC"), "upsample_bilinear2d_backward_nhwc_ac1_bf16"),
])
def test_upsample_kernel_names_exact(args, name):
    spec = UpsampleSpec(*args)
    assert spec.kernel_name == name
    assert spec.function_names() == (name, name + "_same_size")
    assert spec.function_name(same_size=True) == name + "_same_size"


def test_kernel_and_function_names_are_unique():
    specs = list(all_specs())
    # each grid sampler (forward, backward) and each upsample (forward, backward) direction
    assert len(specs) == 2 * (len(INTERPOLATION_MODES) * len(PADDING_MODES) * 2 * len(DTYPES) + 2 * len(DTYPES) * 2)
    names = [s.kernel_name for s in specs]
    assert len(set(names)) == len(names)
    funcs = [f for s in specs for f in s.function_names()]
    assert len(set(funcs)) == len(funcs)


def test_invalid_spec_parameters_are_rejected():
    with pytest.raises(ValueError):
        GridSamplerSpec("linear", "zeros", False)
    with pytest.raises(ValueError):
        GridSamplerSpec("bilinear", "reflect", False)
    with pytest.raises(KeyError):
        GridSamplerSpec("bilinear", "zeros", False, "int32")
    with pytest.raises(ValueError):
        UpsampleSpec(False, "float32", "NDHWC")


# ----------------------------------------------------------------------------------------
# Mode, padding and dtype specific code
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", GRID_SPECS, ids=spec_id)
def test_interpolation_mode_code(spec):
    text = rendered(spec)
    cubic_a = re.search(r"arith\.constant -0\.75 : !ct", text) is not None
    if spec.interpolation_mode == "nearest":
        # round half to even (std::nearbyint) by adding and subtracting 2^mantissa_bits
        assert "math.copysign" in text and re.search(r"%xr_small = arith\.cmpf olt", text)
        assert not cubic_a
    elif spec.interpolation_mode == "bilinear":
        assert re.search(r"%x0 = math\.floor %ix", text) and re.search(r"%y0 = math\.floor %iy", text)
        assert "%xr_small" not in text
        assert not cubic_a
    else:
        assert cubic_a  # the cubic convolution coefficient A = -0.75
        assert re.search(r"%x0 = math\.floor %ix", text)
        assert "%xr_small" not in text


REFLECT_CODE = re.compile(r"%\w+_span = arith\.addf")  # the reflect macro's period


@pytest.mark.parametrize("spec", GRID_SPECS, ids=spec_id)
def test_padding_mode_code(spec):
    text = rendered(spec)
    if spec.padding_mode == "reflection":
        assert REFLECT_CODE.search(text)
        assert "scf.while" in text  # the exact fmod by the reflection period
    else:
        assert not REFLECT_CODE.search(text)
        assert "scf.while" not in text
    if spec.padding_mode == "zeros" and spec.interpolation_mode != "bicubic":
        # zeros padding keeps the coordinate: no clip of it (only index clamps)
        assert not re.search(r"%ixc = arith\.minnumf", text)
    if spec.padding_mode == "border" and spec.interpolation_mode != "bicubic":
        assert re.search(r"%ixc = arith\.minnumf", text)  # clip_coordinates


@pytest.mark.parametrize("spec", GRID_SPECS, ids=spec_id)
def test_dtype_conversions(spec):
    text = rendered(spec)
    d = DTYPES[spec.dtype]
    assert f"!st = {d.storage}\n" in text and f"!ct = {d.compute}\n" in text
    if spec.dtype in ("float16", "bfloat16"):
        assert "arith.extf" in text and "arith.truncf" in text  # compute in f32, round once
        assert "!ct = f32\n" in text
    else:
        assert "arith.extf" not in text and "arith.truncf" not in text


@pytest.mark.parametrize("spec", [s for s in UPSAMPLE_SPECS if s.dtype != "float64"], ids=spec_id)
def test_upsample_dtype_conversions(spec):
    _need_upsample_template()
    text = rendered(spec)
    has = "arith.extf" in text and "arith.truncf" in text
    assert has == (spec.dtype in ("float16", "bfloat16"))
    if spec.dtype == "float32":
        assert "arith.extf" not in text and "arith.truncf" not in text


# ----------------------------------------------------------------------------------------
# A misspelt parameter fails at render time (StrictUndefined)
# ----------------------------------------------------------------------------------------
RENDER_PARAM_SPECS = [GridSamplerSpec("bilinear", "zeros", False, "float32"),
                      GridSamplerSpec("nearest", "border", True, "float16"),
                      GridSamplerSpec("bicubic", "reflection", True, "float64")]


def _render_without(spec, param, misspelt=True, target=None):
    params = spec.template_params(target)
    value = params.pop(param)
    if misspelt:
        params[param + "_"] = value  # e.g. "padding_" instead of "padding"
    return render_mod._environment().get_template(spec.template).render(**params)


GRID_PARAM_CASES = [pytest.param(spec, param, id=f"{spec.kernel_name}-{param}")
                    for spec in RENDER_PARAM_SPECS for param in spec.template_params()]


def _raises_for_some_target(spec, param) -> bool:
    """A parameter is used by the CPU or a GPU form (or both): misspelt, it must fail one (CUDA's
    modules have float64 atomics, so its one-pass grid-sampler backward is there in float64)."""
    for target in (None, get_target("vulkan-spirv"), get_target("cuda")):
        try:
            _render_without(spec, param, target=target)
        except jinja2.UndefinedError:
            return True
    return False


@pytest.mark.parametrize("spec,param", GRID_PARAM_CASES)
def test_misspelt_grid_sampler_parameter_raises(spec, param):
    assert _raises_for_some_target(spec, param)


UPSAMPLE_PARAM_CASES = [
    pytest.param(spec, p, id=f"{spec.layout}-{p}")
    for spec in (UpsampleSpec(True, "float16", "NHWC"), UpsampleSpec(False, "float32", "NCHW"))
    for p in spec.template_params()]


@pytest.mark.parametrize("spec", [GridSampler2dSpec("bilinear", "border", False, "float32"),
                                  GridSampler2dSpec("nearest", "zeros", True, "bfloat16"),
                                  UpsampleBilinear2dSpec(False, "float32", "NCHW"),
                                  UpsampleBilinear2dSpec(True, "float64", "NHWC")], ids=spec_id)
def test_forward_cpu_forms_need_cpu_gather(spec):
    """The forward families' CPU forms read `cpu_gather` (whether the CPU has gather
    instructions) strictly, as the backward's do: a spec that misspells it fails to render
    rather than guessing from the ISA."""
    if spec.op == UpsampleBilinear2dSpec.op:
        _need_upsample_template()
    with pytest.raises(jinja2.UndefinedError):
        _render_without(spec, "cpu_gather")


@pytest.mark.parametrize("spec,param", UPSAMPLE_PARAM_CASES)
def test_misspelt_upsample_parameter_raises(spec, param):
    _need_upsample_template()
    assert _raises_for_some_target(spec, param)


def test_environment_is_strict():
    env = render_mod._environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ nothing }}").render()


# ----------------------------------------------------------------------------------------
# 64-bit offsets
# ----------------------------------------------------------------------------------------
FP_TO_INT = re.compile(r"arith\.(fptosi|fptoui) (%\w+) : (\S+) to (\S+)")


# The grid gradient's AVX2 gathers (x86, float32/float64): a tap's plane offsets (y * W + x,
# i64 lanes) narrowed to the gather instructions' i32 lanes, used only under %hw_ok (H * W
# below 2^31, so every offset in a plane fits); elsewhere vector.gather takes the i64 lanes.
GATHER_TRUNC = re.compile(r"^\s*%po\w+_32 = arith\.trunci %po\w+ : vector<(\d+)xi64> to vector<\1xi32>$")
GATHER_I32 = [GATHER_TRUNC,
              re.compile(r"^\s*%xg_mask_i = arith\.constant dense<-1> : vector<8xi32>$"),
              re.compile(r"^\s*%xg_mask = arith\.bitcast %xg_mask_i : vector<8xi32> to vector<8xf32>$"),
              re.compile(r"^\s*%\w+_o\d = vector\.shuffle (%po\w+_32), \1 \[[\d, ]+\] : vector<8xi32>, vector<8xi32>$"),
              re.compile(r'^\s*%\w+ = llvm\.call_intrinsic "llvm\.x86\.avx2\.gather\.d\.p[sd]\.256"\(.*vector<[48]xi32>, '),
              re.compile(r"^\s*%i32max = arith\.constant 2147483647 : index$"),
              re.compile(r"^\s*%hw_ok = arith\.cmpi ule, %HWp, %i32max : index$")]


def _gathers_under_hw_ok(text):
    """Every AVX2 gather lies in the then-region of an `scf.if %hw_ok` (the nearest scf.if
    above it), and %hw_ok is H * W <= 2^31 - 1."""
    lines = text.splitlines()
    gathers = [i for i, line in enumerate(lines) if "llvm.x86.avx2.gather" in line]
    if gathers:
        assert any(re.fullmatch(r"\s*%hw_ok = arith\.cmpi ule, %HWp?, %i32max : index", line) for line in lines)
    for i in gathers:
        above = next(line for line in reversed(lines[:i]) if "scf.if" in line or "} else {" in line)
        assert "scf.if %hw_ok" in above, f"an AVX2 gather outside scf.if %hw_ok: {lines[i].strip()}"


def _check_64bit_conversions(text, expect=True):
    convs = FP_TO_INT.findall(text)
    assert convs or not expect, "expected float -> int conversions of coordinates"
    for op, _, src, dst in convs:
        assert re.fullmatch(r"i64|vector<\d+xi64>", dst), f"arith.{op} ... : {src} to {dst} (must be i64)"
    assert not re.search(r"(!ct|f16|bf16|f32|f64) to i32", text)
    truncs = [line for line in text.splitlines() if "arith.trunci" in line]
    assert all(GATHER_TRUNC.match(line) for line in truncs), truncs[:3]
    _gathers_under_hw_ok(text)


@pytest.mark.parametrize("spec", GRID_SPECS, ids=spec_id)
def test_offsets_are_64_bit(spec):
    """Every float coordinate becomes an offset through i64 and then index (64-bit on
    64-bit targets); nothing narrows a coordinate or an offset to i32.  Only the six
    sizes (and the channel-block count and the dx band's pixel count, both below H*W*C)
    travel as i32 push constants (each < 2^31), widened without sign extension
    (index_castui / uitofp), beside the block pass's gradient flags, @dgrid_final's
    choice and @grid_runs's flag word (tested bit by bit or against zero, never an
    offset) and the device's worker count (a workgroup count)."""
    text = rendered(spec)
    _check_64bit_conversions(text)
    # each i64 from a float conversion goes straight to index, or stays a vector of i64
    # (the point-parallel pass's gather offsets, 64-bit lanes)
    for name in re.findall(r"(%\w+) = arith\.fpto[su]i", text):
        assert (re.search(rf"= arith\.index_cast {re.escape(name)} : i64 to index", text)
                or re.search(rf"{re.escape(name)} = arith\.fptosi %\w+ : !vc to vector<\d+xi64>", text)), name
    # i32 appears only for the six sizes
    for line in text.splitlines():
        if "i32" not in line:
            continue
        ok = (re.search(r"hal\.interface\.constant\.load .* : i32$", line)
              or re.search(r"arith\.index_castui %k\d : i32 to index", line)
              or re.search(r"arith\.uitofp %k\d : i32 to !ct", line)
              or re.search(r"%\w+i = arith\.index_cast %(N|C|H|W|Ho|Wo|NB|Pb) : index to i32", line)
              # the dx band's pixels and the blocks per image, as push constants
              or re.search(r"^\s*%(Pb|NB) = arith\.index_castui %k(pb|nb) : i32 to index$", line)
              or re.search(r"flow\.dispatch|^\s*: \(i32, i32, i32, i32, i32, i32,", line)
              # the CPU dispatches' floating-point control register (MXCSR is 32 bits), never an offset
              or re.search(r"^\s*(%fpenv_\w+ = |llvm\.store %fpenv_)", line)
              or re.search(r"^\s*: \(i32, i32, i32, i32, tensor<\?x\?x\?x\?x2x!ct>", line)  # the block sum
              # the block pass's flags: constants, and a bit test of the seventh push constant
              or re.search(r"^\s*%(kflags0|c[012]_i32) = arith\.constant [0-3] : i32$", line)
              or re.search(r"^\s*%kf_d[xg] = arith\.andi %kf, %c[12]_i32 : i32$", line)
              or re.search(r"^\s*%with_d[xg] = arith\.cmpi ne, %kf_d[xg], %c0_i32 : i32$", line)
              # the flags and @dgrid_final's choice as the host picks them (islot_count)
              or re.search(r"^\s*%(kf_all|kf_dx|kf_dg|kf_none|use[01]) = arith\.constant [0-3] : i32$", line)
              or re.search(r"^\s*%(kflags0|usei) = arith\.select %fits, %\w+, %\w+ : i32$", line)
              # nearest's table flag (8): set by the host where the table fits, tested by the pass
              or re.search(r"^\s*%(c8_i32|kf_tab) = arith\.constant (8|9) : i32$", line)
              or re.search(r"^\s*%kf_tab = arith\.andi %kf, %c8_i32 : i32$", line)
              or re.search(r"^\s*%use_tab = arith\.cmpi ne, %kf_tab, %c0_i32 : i32$", line)
              or re.search(r"^\s*%kflags0 = arith\.select %fits_t, %kf_tab, %kf_dx : i32$", line)
              # the packed slot pixels' flag (16): set by the host, tested by the pass
              or re.search(r"^\s*%(c16_i32|kf_pk|kf_p2) = arith\.constant (16|0) : i32$", line)
              or re.search(r"^\s*%kf_st = arith\.select %use_p2, %kf_p2, %kf_pk : i32$", line)
              or re.search(r"^\s*%kflags = arith\.ori %kflags0, %kf_st : i32$", line)
              or re.search(r"^\s*%kf_pk = arith\.andi %kf, %c16_i32 : i32$", line)
              or re.search(r"^\s*%packed = arith\.cmpi ne, %kf_pk, %c0_i32 : i32$", line)
              # the fused grid-gradient flag (32, `<kernel>_points`): set by the host, tested by the pass
              or re.search(r"^\s*%(c32_i32|kf_pts) = arith\.constant 32 : i32$", line)
              or re.search(r"^\s*%kflags_r = arith\.ori %kflags, %kf_pts : i32$", line)
              or re.search(r"^\s*%kf_pg = arith\.andi %kf, %c32_i32 : i32$", line)
              or re.search(r"^\s*%with_pg = arith\.cmpi ne, %kf_pg, %c0_i32 : i32$", line)
              # @dgrid_final point-parallel with no block pass before it: no blocks, by points
              or re.search(r"^\s*%(NBi|usei) = arith\.constant 0 : i32$", line)
              or re.search(r"^\s*%use_part = arith\.cmpi ne, %kuse, %c0_i32 : i32$", line)
              # @grid_runs's flag word (0/1): written, read where a flag bit says so, tested
              # against zero; the flag bits (4: the block pass, 2: @dgrid_final) set and tested
              or re.search(r"^\s*%(flag|rm_\d) = hal\.interface\.binding\.subspan .* : memref<1xi32>$", line)
              or re.search(r"^\s*%fl = arith\.extui %smooth : i1 to i32$", line)
              or re.search(r"^\s*memref\.store %fl, %flag\[%c0\] : memref<1xi32>$", line)
              or re.search(r"^\s*%rl_\d = memref\.load %rm_\d\[%c0\] : memref<1xi32>$", line)
              or re.search(r"^\s*%(r[bz]_\d|kf_runs) = arith\.constant [024] : i32$", line)
              or re.search(r"^\s*%rk_\d = arith\.andi %k(f|use), %rb_\d : i32$", line)
              or re.search(r"^\s*%(rc_\d|skip|by_points) = arith\.cmpi ne, %r[kv]_\d, %rz_\d : i32$", line)
              or re.search(r"^\s*%rv_\d = scf\.if %rc_\d -> \(i32\) \{$", line)
              or re.search(r"^\s*scf\.yield %r[lz]_\d : i32$", line)
              or re.search(r"^\s*%kflags_r = arith\.ori %kflags, %kf_runs : i32$", line)
              or re.search(r"^\s*%kuse1 = arith\.andi %kuse, %c1_i32 : i32$", line)
              or re.search(r"^\s*%use_part0 = arith\.cmpi ne, %kuse1, %c0_i32 : i32$", line)
              or re.search(r"^\s*%no_runs = arith\.constant dense<\[0, 1\]> : tensor<2xi32>$", line)
              # the worker count, which caps the block pass's workgroup count
              or re.search(r'hal\.device\.query<%device : !hal\.device> key\("hal\.dispatch" :: "concurrency"\) : i1, i32 = 1 : i32$', line)
              or re.search(r"^\s*%wk = arith\.index_castui %workers : i32 to index$", line)
              # the grid gradient's AVX2 gathers (GATHER_I32, under %hw_ok)
              or any(p.search(line) for p in GATHER_I32))
        assert ok, f"unexpected i32 use: {line.strip()}"


@pytest.mark.parametrize("spec", [s for s in UPSAMPLE_SPECS if s.layout == "NCHW"], ids=spec_id)
def test_upsample_offsets_are_64_bit(spec):
    """Offsets are 64-bit everywhere; the CPU @axis_table alone converts floats to i32 lanes:
    positions along one axis (below its size, an i32 push constant), each clamped below 2^31
    first (so the conversion is defined for any float), and never an offset (the tables are
    indexed by `index`)."""
    _need_upsample_template()
    text = rendered(spec)
    start = text.index("func.func @axis_table()")
    end = text.index("func.func", start + 1)
    table, rest = text[start:end], text[:start] + text[end:]
    # The same-size pass's element count travels as two i32 push constants (lo, hi) that
    # @same_size widens and joins again: the only narrowing outside the table.
    split = ["%lo = arith.trunci %n64 : i64 to i32", "%hi64 = arith.shrui %n64, %c32_i64 : i64",
             "%hi = arith.trunci %hi64 : i64 to i32"]
    for line in split:
        assert rest.count(line) == 1, line
        rest = rest.replace(line, "")
    assert "%c32_i64 = arith.constant 32 : i64" in rest
    for line in ["%lo = arith.index_castui %k0 : i32 to index", "%hi = arith.index_castui %k1 : i32 to index",
                 "%hi_s = arith.shli %hi, %c32 : index", "%n = arith.ori %hi_s, %lo : index"]:
        assert line in rest, line
    _check_64bit_conversions(rest, expect=False)
    convs = FP_TO_INT.findall(table)
    assert convs, "expected the table's float -> int conversions"
    for op, operand, src, dst in convs:
        assert op == "fptosi" and dst == "vector<8xi32>", (op, operand, dst)
        clamp = re.search(rf"{re.escape(operand)} = arith\.minnumf %\w+, %vimax(32)? : ", table)
        assert clamp, f"{operand} is converted to i32 without the clamp below 2^31"
    assert re.search(r"%vimax = arith\.constant dense<2147483520\.0> : vector<8x!ct>", table)
    assert not re.search(r"memref\.(load|store) [^\n]*\[[^\]]*%(t|k)\w*32", table), "an i32 index into memory"


# ----------------------------------------------------------------------------------------
# GPU forms
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", list(all_specs()), ids=lambda s: s.kernel_name)
def test_gpu_forms_render_with_their_exports(spec):
    vk = get_target("vulkan-spirv")
    text = render_mod.render(spec, vk)
    funcs = re.findall(r"util\.func public @(\w+)\(", text)
    assert set(funcs) == set(spec.function_names(vk))
    assert "gpu.thread_id x" in text and "translation_info = #gpu_ti" in text
    assert "hal.interface.workgroup.id" in text
    # no CPU workgroup code (vector ops, stack buffers) in the GPU form
    assert "vector." not in text and "memref.alloca" not in text
    assert text != render_mod.render(spec)


@pytest.fixture
def fresh_environment(monkeypatch, tmp_path):
    """render's Jinja2 environment made again with its bytecode cache under tmp_path/cache;
    the suite's own environment is restored afterwards."""
    monkeypatch.setenv("ACLNN_IREE_CACHE", str(tmp_path / "cache"))
    render_mod._environment.cache_clear()
    yield tmp_path / "cache" / "jinja2"
    render_mod._environment.cache_clear()


def _refuse_compiling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the template was compiled although its bytecode was cached")
    monkeypatch.setattr(render_mod._environment(), "compile", refuse)


def test_a_second_environment_renders_from_the_cached_bytecode(fresh_environment, monkeypatch):
    """What a new process sees: the templates compiled by an earlier one come from the cache
    (no Jinja2 compile), with the same text."""
    specs = [GRID_SPECS[0], UPSAMPLE_SPECS[-1]]
    first = [render_mod.render(s) for s in specs]
    assert len(list(fresh_environment.glob("__jinja2_*.cache"))) >= 2  # the templates and their imports
    render_mod._environment.cache_clear()
    _refuse_compiling(monkeypatch)
    assert [render_mod.render(s) for s in specs] == first
    assert first[0] == rendered(GRID_SPECS[0])


def test_a_damaged_cache_entry_is_compiled_again(fresh_environment):
    want = render_mod.render(GRID_SPECS[0])
    entries = list(fresh_environment.glob("__jinja2_*.cache"))
    for e in entries:
        e.write_bytes(e.read_bytes()[:40])  # Jinja2's header, then a truncated code object
    render_mod._environment.cache_clear()
    assert render_mod.render(GRID_SPECS[0]) == want


def test_an_unwritable_cache_directory_renders_without_a_cache(monkeypatch, tmp_path):
    """The cache directory below a regular file (unmakeable even for root): the same text."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ACLNN_IREE_CACHE", str(tmp_path / "file" / "cache"))
    render_mod._environment.cache_clear()
    try:
        assert render_mod.render(UPSAMPLE_SPECS[0]) == rendered(UPSAMPLE_SPECS[0])
    finally:
        render_mod._environment.cache_clear()


@pytest.mark.parametrize("isa,save,restore", [("x86", "llvm.x86.sse.stmxcsr", "llvm.x86.sse.ldmxcsr"),
                                              ("aarch64", "llvm.aarch64.get.fpcr", "llvm.aarch64.set.fpcr")])
def test_every_cpu_dispatch_keeps_subnormals_and_restores_the_fp_state(isa, save, restore, monkeypatch):
    """Each CPU dispatch (a func.func of a hal.executable.source) saves the floating-point
    control register first, clears the flush bits and restores the saved value before its
    return (templates/_common.mlir.j2 fpenv_ieee / fpenv_restore): a new CPU dispatch
    without them would flush subnormals again (tests/test_subnormals.py).  GPU forms have none."""
    from aclnn_iree.compiler import specs as S
    monkeypatch.setattr(S, "cpu_isa", lambda: isa)
    for spec in all_specs():
        cpu = render_mod.render(spec, get_target("llvm-cpu"))
        bodies = re.findall(r"func\.func @\w+\(\)[^{]*\{(.*?)\n      return\n    \}", cpu, flags=re.S)
        assert bodies and len(bodies) == cpu.count("func.func @"), spec.kernel_name
        for body in bodies:
            assert body.count(save) == 1 and body.count(restore) == 2, spec.kernel_name
            assert body.index(save) < body.index("hal.interface") and body.rstrip().endswith(
                f'"{restore}"(%fpenv_slot) : (!llvm.ptr) -> ()' if isa == "x86" else
                f'"{restore}"(%fpenv_saved) : (i64) -> ()'), spec.kernel_name
        gpu = render_mod.render(spec, get_target("vulkan-spirv"))
        assert save not in gpu and "fpenv" not in gpu
