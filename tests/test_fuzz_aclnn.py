"""Fuzzing the aclnn layer: both phase-1 functions (and phase 2 when phase 1 succeeds) with arguments drawn
from a mix of good values and bad ones (wrong Python types, destroyed objects, tensors of the wrong
rank/shape/dtype/format/device, absurd ints, int/bool arrays of the wrong length, NaN/inf scales,
destroyed streams, workspaces of the wrong size/device or freed).

Properties (docs/semantics.md#invalid-and-extreme-inputs, "never crash"): no exception escapes; phase 1 returns a tuple
(status: int, workspaceSize: int, executor) with (status, 0, None) on failure; phase 2 and the stream
calls return an int status; every status is an aclnn code; every non-zero status leaves a non-empty
aclGetRecentErrMsg().  When everything succeeds the grid sampler's results are checked against the
float64 reference and the output mask (a masked-out output keeps its sentinel 7).

Shapes are tiny and the good specialisations are the few the other tests use, so kernels compile once.
"""
from __future__ import annotations


import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aclnn_iree import aclnn as A
from aclnn_iree.ops import reference as R
from aclnn_iree.core.errors import STATUS_NAMES


CODES = frozenset(STATUS_NAMES)
DEVICE, OTHER_DEVICE = "local-task", "local-sync"
SENTINEL = 7.0
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "float64": np.dtype(np.float64),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}
TOL = {"float32": 2e-5, "float16": 4e-3, "float64": 1e-10, "bfloat16": 3e-2}

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----------------------------------------------------------------------------- checks
def _clear_message():
    """Forget the thread's last message, so that a non-empty one afterwards comes from the call checked."""
    A._set_error("")


def check_status(status):
    assert type(status) is int, f"status {status!r} is not an int"
    assert status in CODES, f"status {status} is not an aclnn code"
    event(f"status {STATUS_NAMES[status]}")
    if status != A.ACLNN_SUCCESS:
        assert A.aclGetRecentErrMsg(), f"status {status} without a message"
    return status


def check_phase1(result):
    assert isinstance(result, tuple) and len(result) == 3, result
    status, size, executor = result
    check_status(status)
    assert type(size) is int and size >= 0, result
    if status == A.ACLNN_SUCCESS:
        assert isinstance(executor, A.aclOpExecutor)
        assert size == executor.workspace_size
    else:
        assert (size, executor) == (0, None), result
    return result


def call(fn, *args):
    _clear_message()
    return check_status(fn(*args))


# ----------------------------------------------------------------------------- argument factories
# Each parameter is "good" most of the time (so that later checks and phase 2 are reached) or one of
# the bad kinds.  Drawing names keeps the examples printable and the run deterministic.
@st.composite
def corrupt(draw, choices: dict, max_bad=2):
    """{param: kind}: every param "good" except 0..max_bad of them (about half the cases have none),
    each of which gets one of its bad kinds from `choices` ({param: (bad kinds...)})."""
    n_bad = draw(st.sampled_from([0, 0, 0, 1, 1, 1] + [2] * (max_bad >= 2)))
    bad = draw(st.lists(st.sampled_from(sorted(choices)), min_size=n_bad, max_size=n_bad, unique=True))
    return {p: (draw(st.sampled_from(choices[p])) if p in bad else "good") for p in choices}


TENSOR_BAD = ("none", "str", "dict", "float", "list", "numpy", "destroyed", "rank3", "rank5", "dtype_f64",
              "dtype_int", "shape", "other_device")


def make_tensor(kind, array, fmt="ND"):
    """An aclTensor over `array` (good), or the bad thing named by `kind`."""
    simple = {"none": None, "str": "tensor", "dict": {}, "float": 1.5, "list": [1.0, 2.0], "numpy": array}
    if kind in simple:
        return simple[kind]
    if kind == "good":
        return A.aclCreateTensor(array, fmt)
    if kind == "destroyed":
        t = A.aclCreateTensor(array, fmt)
        assert A.aclDestroyTensor(t) == A.ACLNN_SUCCESS
        return t
    if kind == "rank3":
        return A.aclCreateTensor(np.zeros(array.shape[:3], array.dtype), fmt)
    if kind == "rank5":
        return A.aclCreateTensor(array[None], fmt)
    if kind == "dtype_f64":
        return A.aclCreateTensor(array.astype(np.float32 if array.dtype == np.float64 else np.float64), fmt)
    if kind == "dtype_int":
        return A.aclCreateTensor(array.astype(np.int32), fmt)
    if kind == "shape":
        return A.aclCreateTensor(np.zeros(tuple(s + 1 for s in array.shape), array.dtype), fmt)
    if kind == "other_device":
        return A.aclCreateTensor(array, fmt, device=OTHER_DEVICE)
    if kind in ("NCHW", "NHWC", "ND"):
        return A.aclCreateTensor(array, kind)
    raise AssertionError(kind)


INT_BAD = {"neg": -1, "three": 3, "big": 2**63, "hugeneg": -2**70, "float": 1.5, "str": "0", "none": None,
           "bool": True, "nan": float("nan"), "npfloat": np.float64(1.0)}
BOOL_BAD = {"none": None, "int": 1, "str": "True", "float": 0.0, "list": [True]}


def make_bool_array(kind, good_values):
    if kind == "good":
        return A.aclCreateBoolArray(list(good_values))
    if kind == "destroyed":
        a = A.aclCreateBoolArray(list(good_values))
        A.aclDestroyBoolArray(a)
        return a
    return {"none": None, "list": list(good_values), "len0": A.aclCreateBoolArray([]),
            "len1": A.aclCreateBoolArray([True]), "len3": A.aclCreateBoolArray([True, False, True]),
            "int_array": A.aclCreateIntArray([1, 1]), "str": "TT"}[kind]


def make_int_array(kind, good_values):
    if kind == "good":
        return A.aclCreateIntArray(list(good_values))
    if kind == "destroyed":
        a = A.aclCreateIntArray(list(good_values))
        A.aclDestroyIntArray(a)
        return a
    g = list(good_values)
    return {"none": None, "list": g, "short": A.aclCreateIntArray(g[:-1]), "long": A.aclCreateIntArray(g + [1]),
            "empty": A.aclCreateIntArray([]), "neg": A.aclCreateIntArray([-v - 1 for v in g]),
            "zeros": A.aclCreateIntArray([0] * len(g)), "huge": A.aclCreateIntArray([2**62] * len(g)),
            "bool_array": A.aclCreateBoolArray([True] * len(g)), "str": "1,2"}[kind]


# ----------------------------------------------------------------------------- phase 2
PHASE2 = dict(
    workspace=("none", "small", "freed", "other_device", "str", "larger"),
    size=("minus1", "neg", "str", "float", "huge", "bool", "zero"),
    stream=("destroyed", "none", "str", "other_device"),
    executor=("none", "used", "destroyed", "str"),
)


def run_phase2(run, ws, executor, kinds):
    """Phase 2 with possibly bad workspace/size/stream/executor; returns (status, stream used) for a good
    stream else (status, None)."""
    _, stream = A.aclrtCreateStream(DEVICE)
    wk = kinds["workspace"]
    if wk == "good":
        workspace = A.aclrtMalloc(ws, stream)[1] if ws > 0 else None
    elif wk == "none":
        workspace = None
    elif wk == "small":
        workspace = A.aclrtMalloc(max(ws - 1, 0), stream)[1]
    elif wk == "freed":
        workspace = A.aclrtMalloc(ws, stream)[1]
        A.aclrtFree(workspace)
    elif wk == "other_device":
        workspace = A.aclrtMalloc(ws, OTHER_DEVICE)[1]
    elif wk == "larger":
        workspace = A.aclrtMalloc(2 * ws + 64, stream)[1]
    else:
        workspace = "workspace"
    size = {"good": ws, "minus1": ws - 1, "neg": -1, "str": str(ws), "float": float(ws), "huge": 2**70,
            "bool": bool(ws), "zero": 0}[kinds["size"]]
    sk = kinds["stream"]
    if sk == "good":
        s = stream
    elif sk == "destroyed":
        _, s = A.aclrtCreateStream(DEVICE)
        A.aclrtDestroyStream(s)
    elif sk == "other_device":
        _, s = A.aclrtCreateStream(OTHER_DEVICE)
    else:
        s = {"none": None, "str": "stream"}[sk]
    ek = kinds["executor"]
    if ek == "used":
        if call(run, workspace, size, executor, s) == A.ACLNN_SUCCESS:
            call(A.aclrtSynchronizeStream, s)
    elif ek == "destroyed":
        call(A.aclDestroyAclOpExecutor, executor)
    elif ek in ("none", "str"):
        executor = None if ek == "none" else "executor"
    status = call(run, workspace, size, executor, s)
    if status == A.ACLNN_SUCCESS:
        # a successful enqueue finishes; the stream calls return statuses too
        sync = call(A.aclrtSynchronizeStream, s)
        if ek != "used":
            # a single-use executor is used up now (a repeatable one never appears here)
            assert call(run, workspace, size, executor, s) == A.ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR
        return status, sync, (s if sk == "good" else None)
    return status, None, None


# ----------------------------------------------------------------------------- grid sampler
GS_GOOD_MODES = [(0, 0, False), (1, 1, True), (2, 2, False)]  # float32; other dtypes use (0, 0, False)


@st.composite
def grid_sampler_case(draw):
    dtype = draw(st.sampled_from(["float32", "float32", "float32", "float16", "float64", "bfloat16"]))
    size = st.sampled_from([1, 2, 3] * 4 + [0])  # mostly non-empty
    dims = dict(N=draw(size), C=draw(size), H=draw(size), W=draw(size), Ho=draw(size), Wo=draw(size))
    modes = draw(st.sampled_from(GS_GOOD_MODES)) if dtype == "float32" else (0, 0, False)
    mask = draw(st.sampled_from([(True, True), (True, False), (False, True), (False, False)]))
    kinds = draw(corrupt({**{name: TENSOR_BAD + ("NHWC",)
                              for name in ("gradOutput", "input", "grid", "inputGrad", "gridGrad")},
                           "interpolationMode": tuple(INT_BAD), "paddingMode": tuple(INT_BAD),
                           "alignCorners": tuple(BOOL_BAD),
                           "outputMask": ("none", "list", "len0", "len1", "len3", "int_array", "str",
                                          "destroyed")}))
    phase2 = draw(corrupt(PHASE2, max_bad=1))
    seed = draw(st.integers(0, 2**16))
    return dtype, dims, modes, mask, kinds, phase2, seed


@FUZZ
@given(grid_sampler_case())
def test_fuzz_grid_sampler(case):
    dtype, d, (mode, pad, ac), mask, kinds, phase2, seed = case
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    go = rng.standard_normal((d["N"], d["C"], d["Ho"], d["Wo"])).astype(dt)
    x = rng.standard_normal((d["N"], d["C"], d["H"], d["W"])).astype(dt)
    grid = rng.uniform(-1.3, 1.3, (d["N"], d["Ho"], d["Wo"], 2)).astype(dt)
    args = dict(gradOutput=make_tensor(kinds["gradOutput"], go), input=make_tensor(kinds["input"], x),
                grid=make_tensor(kinds["grid"], grid),
                inputGrad=make_tensor(kinds["inputGrad"], np.full(x.shape, SENTINEL, dt)),
                gridGrad=make_tensor(kinds["gridGrad"], np.full(grid.shape, SENTINEL, dt)))
    m = mode if kinds["interpolationMode"] == "good" else INT_BAD[kinds["interpolationMode"]]
    p = pad if kinds["paddingMode"] == "good" else INT_BAD[kinds["paddingMode"]]
    a = ac if kinds["alignCorners"] == "good" else BOOL_BAD[kinds["alignCorners"]]
    om = make_bool_array(kinds["outputMask"], mask)

    _clear_message()
    result = check_phase1(A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        args["gradOutput"], args["input"], args["grid"], m, p, a, om, args["inputGrad"], args["gridGrad"]))
    status, ws, executor = result
    all_good = all(k in ("good", "NHWC") for k in kinds.values())
    if status != A.ACLNN_SUCCESS:
        # with every argument good, only an empty input image may fail
        assert not all_good or d["H"] == 0 or d["W"] == 0, A.aclGetRecentErrMsg()
        return
    if (not mask[0] and not mask[1]) or go.size == 0 or x.size == 0 or grid.size == 0:
        assert ws == 0, "nothing to compute needs no workspace (docs/status-codes.md#grid-sampler-backward-checks)"
    st2, sync, stream = run_phase2(A.aclnnGridSampler2DBackward, ws, executor, phase2)
    if st2 != A.ACLNN_SUCCESS or stream is None:
        return
    assert sync == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    if all_good and x.size and grid.size:
        event("grid sampler results checked")
        dx, dg = args["inputGrad"].numpy(), args["gridGrad"].numpy()
        r_dx, r_dg = R.grid_sampler_2d_backward(go, x, grid, mode, pad, ac)
        for got, ref, wanted in ((dx, r_dx, mask[0]), (dg, r_dg, mask[1])):
            if wanted:
                scale = max(1.0, float(np.max(np.abs(ref))))
                np.testing.assert_allclose(got.astype(np.float64), ref, rtol=TOL[dtype],
                                           atol=TOL[dtype] * scale * 4)
            else:
                assert np.all(got == SENTINEL), "a masked-out output was written"
    call(A.aclrtDestroyStream, stream)


# ----------------------------------------------------------------------------- upsample
UP_GOOD = [("float32", "NCHW", False), ("float32", "NCHW", True), ("float32", "NHWC", False),
           ("float32", "NHWC", True), ("float16", "NCHW", False)]
SCALE_KINDS = ("none",) * 8 + ("zero", "negative", "consistent", "consistent", "nan", "inf", "-inf", "str",
               "pyNone", "huge_int", "bool", "inconsistent", "list")


def make_scale(kind, i, o):
    return {"none": -1.0, "zero": 0.0, "negative": -2.5, "consistent": o / i, "nan": float("nan"),
            "inf": float("inf"), "-inf": -float("inf"), "str": "2.0", "pyNone": None, "huge_int": 10**400,
            "bool": True, "inconsistent": (o + 1.5) / i, "list": [2.0]}[kind]


@st.composite
def upsample_case(draw):
    dtype, fmt, ac = draw(st.sampled_from(UP_GOOD))
    nc = st.sampled_from([1, 2] * 6 + [0])  # mostly non-empty
    dims = dict(N=draw(nc), C=draw(nc), Hi=draw(st.integers(1, 3)), Wi=draw(st.integers(1, 3)),
                Ho=draw(st.integers(1, 4)), Wo=draw(st.integers(1, 4)))
    int_bad = ("none", "list", "short", "long", "empty", "neg", "zeros", "huge", "bool_array", "str", "destroyed")
    other_fmt = "NHWC" if fmt == "NCHW" else "NCHW"
    kinds = draw(corrupt({"gradOut": TENSOR_BAD + ("ND", other_fmt), "out": TENSOR_BAD + ("ND", other_fmt),
                          "outputSize": int_bad, "inputSize": int_bad, "alignCorners": tuple(BOOL_BAD)}))
    scales = (draw(st.sampled_from(SCALE_KINDS)), draw(st.sampled_from(SCALE_KINDS)))
    phase2 = draw(corrupt(PHASE2, max_bad=1))
    seed = draw(st.integers(0, 2**16))
    return dtype, fmt, ac, dims, kinds, scales, phase2, seed


@FUZZ
@given(upsample_case())
def test_fuzz_upsample(case):
    dtype, fmt, ac, d, kinds, (skh, skw), phase2, seed = case
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    N, C, Hi, Wi, Ho, Wo = (d[k] for k in ("N", "C", "Hi", "Wi", "Ho", "Wo"))
    nhwc = fmt == "NHWC"
    g = rng.standard_normal((N, Ho, Wo, C) if nhwc else (N, C, Ho, Wo)).astype(dt)
    isz = [N, Hi, Wi, C] if nhwc else [N, C, Hi, Wi]
    grad_out = make_tensor(kinds["gradOut"], g, fmt)
    out = make_tensor(kinds["out"], np.full(isz, SENTINEL, dt), fmt)
    osz_arr = make_int_array(kinds["outputSize"], [Ho, Wo])
    isz_arr = make_int_array(kinds["inputSize"], isz)
    a = ac if kinds["alignCorners"] == "good" else BOOL_BAD[kinds["alignCorners"]]
    sh, sw = make_scale(skh, Hi, Ho), make_scale(skw, Wi, Wo)

    _clear_message()
    result = check_phase1(A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        grad_out, osz_arr, isz_arr, a, sh, sw, out))
    status, ws, executor = result
    if status != A.ACLNN_SUCCESS:
        return
    st2, sync, stream = run_phase2(A.aclnnUpsampleBilinear2dBackwardV2, ws, executor, phase2)
    if st2 == A.ACLNN_SUCCESS and stream is not None:
        assert sync == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
        event("upsample phase 2 ran")
        call(A.aclrtDestroyStream, stream)


# ----------------------------------------------------------------------------- stream / memory calls
@FUZZ
@given(device=st.sampled_from([DEVICE, OTHER_DEVICE, "no-such-driver", "", None, 0, 1.5, ["local-task"],
                               "local-task:7", "cuda"]),
       size=st.one_of(st.integers(0, 4096),
                      st.sampled_from([-1, -2**70, 2**62, 2**64, 2**70, None, "8", 1.5, True, np.int64(16)])),
       destroy_first=st.booleans())
def test_fuzz_stream_and_memory_calls(device, size, destroy_first):
    _clear_message()
    status, stream = A.aclrtCreateStream(device)
    check_status(status)
    assert (stream is None) == (status != A.ACLNN_SUCCESS)
    if destroy_first and stream is not None:
        assert call(A.aclrtDestroyStream, stream) == A.ACLNN_SUCCESS
    _clear_message()
    st_m, buf = A.aclrtMalloc(size, stream if stream is not None else device)
    check_status(st_m)
    assert (buf is None) == (st_m != A.ACLNN_SUCCESS)
    if buf is not None:
        assert buf.size == size
        assert call(A.aclrtFree, buf) == A.ACLNN_SUCCESS
        assert call(A.aclrtFree, buf) == A.ACLNN_ERR_PARAM_NULLPTR
    if stream is not None:
        expected = A.ACLNN_ERR_PARAM_INVALID if destroy_first else A.ACLNN_SUCCESS
        assert call(A.aclrtSynchronizeStream, stream) == expected
        assert call(A.aclrtDestroyStream, stream) == expected
