"""Workspace bounds (issue 21): the CPU grid sampler's never exceeds its largest input; on
GPUs (Vulkan, at the end) the grid sampler's atomic form and the upsample's intermediate.

The block pass accumulates dx in per-worker slots of a whole (channel block, image) plane
with the channels interleaved (templates/grid_sampler_2d_backward/cpu_slots.mlir.j2), and the two-output and
grad_grid-only calls keep the block's input beside it plus partial grid-gradient sums.
Where that would exceed the largest input (few channels of few images; float16/bfloat16,
whose slots hold float32), islot_count (templates/grid_sampler_2d_backward/cpu_host.mlir.j2) runs dx alone
in bands of pixels that fit and the grid gradient point-parallel (dgrid_points), with no
partial sums.

Oracles, none of them our output for the same call:
* the bound itself: workspace bytes <= the largest input's bytes, from phase 1 (IREE places
  each transient buffer in 64-byte units, so an input under 64 bytes may still get 64);
* the bits of the whole-plane pass: the same image inside a batch of BATCH copies, whose
  slots fit (each (block, image) is computed on its own, and each grid point sums its
  blocks in order), gives the same bits for its first images.  The workspace shows which
  path a call took (_whole_plane_bytes).
Numerics against the float64 reference and PyTorch: test_grid_sampler, test_dtypes and
test_properties, whose small shapes take the banded path.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from aclnn_iree import aclnn as A
from aclnn_iree.core import api
from aclnn_iree.compiler import specs
from aclnn_iree.compiler.specs import DGRID_POINTS_MAX_CHANNELS

DEVICE = "local-task"
BATCH = 32
DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
MASKS = [(True, True), (True, False), (False, True)]
COMBOS = [(m, p, a) for m in (0, 1, 2) for p in (0, 1, 2) for a in (False, True)]  # mode, padding, ac
ALIGN = 64  # IREE's unit for a transient buffer on CPUs


@pytest.fixture(autouse=True, scope="module")
def _slot_pass_whatever_the_size():
    """This file checks the slot pass's workspace bound: grad_grid alone of more than
    DGRID_POINTS_MAX_CHANNELS channels takes it here whatever its size, not the
    point-parallel pass that small calls take (DGRID_POINTS_MAX_ELEMENTS)."""
    from aclnn_iree.runtime import kernels
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(specs, "DGRID_POINTS_MAX_ELEMENTS", {})
        mp.setattr(kernels, "generation", kernels.generation + 1)  # no executor kept from before
        yield


def _units(nbytes):
    """`nbytes` in whole ALIGN-byte units, as IREE places a transient buffer."""
    return -(-nbytes // ALIGN) * ALIGN


def _workspace(go, x, grid, mode, pad, ac, mask, device=DEVICE) -> int:
    status, stream = A.aclrtCreateStream(device)
    assert status == A.ACLNN_SUCCESS

    def t(a):
        return A.aclCreateTensor(a, stream=stream)
    status, ws, ex = A.aclnnGridSampler2DBackwardGetWorkspaceSize(
        t(go), t(x), t(grid), mode, pad, ac, A.aclCreateBoolArray(list(mask)), t(np.empty_like(x)),
        t(np.empty_like(grid)))
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    A.aclDestroyAclOpExecutor(ex)
    return ws


def _arrays(rng, shape, dtype):
    N, C, H, W, Ho, Wo = shape
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    grid = rng.uniform(-1.15, 1.15, (N, Ho, Wo, 2)).astype(dtype)
    go = rng.standard_normal((N, C, Ho, Wo)).astype(dtype)
    return go, x, grid


def _whole_plane_bytes(shape, dtype, mode, mask):
    """The least workspace of the whole-plane pass: one slot (a dx half for dx, an input half
    for the partial grid-gradient sums, H*W*min(C, 8) accumulator values each where packed,
    more where aligned: test_slot_pixels_aligned_where_as_many_slots_fit_else_packed) and the
    partial sums (2 compute-type values per output point and block of 8 channels, in
    64-byte units; none where both outputs take dx alone beside the point-parallel grid
    gradient: SPLIT_POINTS_CHANNELS).  A banded call's workspace is below it: at most the
    largest input, which the whole-plane pass would exceed."""
    N, C, H, W, Ho, Wo = shape
    wide = 8 if np.dtype(dtype) == np.float64 else 4  # the slots' and sums' float width
    split = mask == (True, True) and C in specs.SPLIT_POINTS_CHANNELS
    partials = mask[1] and mode != 1 and not split  # nearest has no grid gradient to sum
    halves = int(mask[0]) + int(partials)
    sums = N * -(-C // 8) * Ho * Wo * 2 * wide if partials else 0
    return halves * H * W * min(C, 8) * wide + _units(sums)


def check_bound_and_bits(shape, dtype, mode, pad, ac, mask, seed=0):
    """The call's workspace is within its largest input, and its outputs have the bits of
    the first images of a batch of BATCH copies.  Returns whether the call and the batch
    ran the whole-plane pass (None for calls without a block pass)."""
    go, x, grid = _arrays(np.random.default_rng(seed), shape, dtype)
    ws = _workspace(go, x, grid, mode, pad, ac, mask)
    largest = max(a.nbytes for a in (go, x, grid))
    assert ws <= max(largest, ALIGN), (ws, largest)
    ours = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, output_mask=mask, device=DEVICE)
    big = [np.concatenate([a] * BATCH) for a in (go, x, grid)]  # the images in order, BATCH times
    batch = api.grid_sampler_2d_backward(*big, mode, pad, ac, output_mask=mask, device=DEVICE)
    for name, a, b in zip(("grad_input", "grad_grid"), ours, batch):
        if a is None:
            assert b is None
            continue
        np.testing.assert_array_equal(np.ascontiguousarray(a).view(np.uint8),
                                      np.ascontiguousarray(b[:shape[0]]).view(np.uint8), err_msg=name)
    if mask == (False, True) and (mode == 1 or shape[1] <= DGRID_POINTS_MAX_CHANNELS):
        return None, None  # no block pass (nearest: zeros; few channels: dgrid_points)
    big_shape = (BATCH * shape[0],) + tuple(shape[1:])
    return (ws >= _whole_plane_bytes(shape, dtype, mode, mask),
            _workspace(*big, mode, pad, ac, mask) >= _whole_plane_bytes(big_shape, dtype, mode, mask))


# Shapes whose single call cannot keep whole-plane slots within its input but whose batch
# can: one 3-channel image with both outputs (the fused slot holds dx and the input: 2x the
# input in float32, 4x in float16), one image of 8 channels in bfloat16 (dx alone needs
# float32 room for the whole plane: 2x), grad_grid alone of 12 channels (two blocks) whose
# input half does not fit, and two images of 12 channels.
FALLBACK_CASES = [
    ((1, 3, 37, 41, 19, 23), np.float32, (True, True)),
    ((1, 3, 37, 41, 19, 23), np.float16, (True, True)),
    ((1, 8, 20, 30, 10, 10), ml_dtypes.bfloat16, (True, False)),
    ((1, 12, 40, 40, 4, 4), ml_dtypes.bfloat16, (False, True)),
    ((2, 12, 16, 17, 9, 8), np.float16, (True, True)),
]


@pytest.mark.parametrize("mode,pad,ac", [(0, 0, False), (1, 1, True), (2, 2, False), (0, 2, True)],
                         ids=["bilinear-zeros", "nearest-border-ac", "bicubic-reflection", "bilinear-reflection-ac"])
@pytest.mark.parametrize("shape,dtype,mask", FALLBACK_CASES,
                         ids=[f"{'x'.join(map(str, s))}-{np.dtype(d).name}-{''.join('10'[not m] for m in k)}"
                              for s, d, k in FALLBACK_CASES])
def test_banded_and_point_parallel_passes_keep_the_bound_and_the_bits(shape, dtype, mask, mode, pad, ac, monkeypatch):
    # the fused pass's fallback (3 channels with both outputs otherwise take dx alone beside
    # the point-parallel grid gradient, whose dx slot fits more often)
    from aclnn_iree.runtime import kernels
    monkeypatch.setattr(specs, "SPLIT_POINTS_CHANNELS", range(0))
    monkeypatch.setattr(kernels, "generation", kernels.generation + 1)  # no executor kept from before
    single, batch = check_bound_and_bits(shape, dtype, mode, pad, ac, mask)
    # The batch ran the whole-plane pass, so the bits compared are its; the call was banded
    # (nearest computes dx alone, whose slot can fit where the two-output one would not).
    assert batch in (True, None)
    assert single is (None if batch is None else False) or mode == 1


def _local_workers():
    """The worker threads of the local-task device as phase 1 counts its slots: dx alone of
    64 one-channel 8 x 8 images has room for 64 slots of 256 B (1 lane a pixel)."""
    go, x, grid = _arrays(np.random.default_rng(0), (64, 1, 8, 8, 8, 8), np.float32)
    ws = _workspace(go, x, grid, 0, 0, False, (True, False))
    assert ws % 256 == 0
    return ws // 256


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_slot_pixels_aligned_where_as_many_slots_fit_else_packed(mode):
    """dx alone of 3 channels: a slot pixel takes 4 lanes (aligned whole vectors) where as
    many whole-plane slots fit as at 3 lanes, else 3 (packed).  One 16 x 16 image fits one
    slot in its input's 3072 bytes only packed; a batch of 4 (12288 bytes) fits 3 aligned
    slots of 4096 bytes or 4 packed ones, so with up to 3 workers (a slot each) it takes
    aligned ones (nearest, whose slots hold a pixel table too, fits 2 packed slots with
    theirs or one aligned).  Both strides give the single image's bits (each (block, image)
    is computed on its own)."""
    shape = (1, 3, 16, 16, 16, 16)
    go, x, grid = _arrays(np.random.default_rng(7), shape, np.float32)
    mask = (True, False)
    assert _workspace(go, x, grid, mode, 0, False, mask) == 16 * 16 * 3 * 4  # packed, one slot
    one = api.grid_sampler_2d_backward(go, x, grid, mode, 0, False, output_mask=mask, device=DEVICE)[0]
    big = [np.concatenate([a] * 4) for a in (go, x, grid)]
    workers = _local_workers()
    if mode == 1:  # each nearest slot also holds its 256 points' pixel table (2048 bytes)
        want = 4096 + 2048 if workers == 1 else 2 * (3072 + 2048)
    else:
        want = workers * 4096 if workers <= 3 else 4 * 3072
    assert _workspace(*big, mode, 0, False, mask) == want
    four = api.grid_sampler_2d_backward(*big, mode, 0, False, output_mask=mask, device=DEVICE)[0]
    for k in range(4):
        np.testing.assert_array_equal(four[k:k + 1].view(np.uint32), one.view(np.uint32))


_EMPTY_PLANE_SCRIPT = """
import json, sys
import numpy as np
from aclnn_iree.compiler.specs import GridSamplerSpec
from aclnn_iree.runtime.device import get_device
from aclnn_iree.runtime.kernels import load_module
from aclnn_iree.core.tensors import view_over
dev = get_device("local-task")
out = []
for mode in ("bilinear", "nearest", "bicubic"):
    spec = GridSamplerSpec(mode, "zeros", False, "float32")
    module = load_module(dev, spec)
    for suffix, outs in (("", (1, 2)), ("_dx", (1,)), ("_dgrid", (2,))):
        kernel = module.kernel(spec.kernel_name + suffix)
        for shapes in json.loads(sys.argv[1]):
            shapes = [tuple(s) for s in shapes]
            views = [view_over(dev.upload(np.zeros(s, np.float32)), s, np.float32)
                     for s in shapes + [shapes[k] for k in outs]]
            out.append([mode + suffix, max(4 * int(np.prod(s)) for s in shapes), kernel.workspace_size(views)])
print(json.dumps(out))
"""


def test_workspace_query_of_an_empty_plane_answers():
    """An app that embeds the modules may ask the `_transients_size` companion about an empty
    input or output plane (H * W = 0 or H_out * W_out = 0; our Python layers zero-fill those
    without a kernel): it answers within the bound, and does not divide by zero (which
    killed the process with SIGFPE before the slot-size guard)."""
    import json
    import subprocess
    import sys
    shapes = [[[1, 3, 4, 4], [1, 3, 0, 5], [1, 4, 4, 2]], [[1, 3, 0, 4], [1, 3, 5, 5], [1, 0, 4, 2]],
              [[2, 8, 3, 0], [2, 8, 6, 7], [2, 3, 0, 2]]]  # grad_output, input, grid
    proc = subprocess.run([sys.executable, "-c", _EMPTY_PLANE_SCRIPT, json.dumps(shapes)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == 3 * 3 * len(shapes)
    for name, largest, ws in rows:
        assert 0 <= ws <= max(largest, ALIGN), (name, largest, ws)


@settings(max_examples=120, deadline=None)
@given(N=st.integers(1, 2), C=st.integers(1, 11), H=st.integers(1, 40), W=st.integers(1, 40),
       Ho=st.integers(1, 24), Wo=st.integers(1, 24), dtype=st.sampled_from(DTYPES),
       combo=st.sampled_from(COMBOS),
       mask=st.sampled_from(MASKS), seed=st.integers(0, 2**16))
# both outputs of 3-6 channels: dx alone, then the point-parallel grad_grid (<kernel>_points)
@example(N=1, C=3, H=37, W=41, Ho=19, Wo=23, dtype=np.float32, combo=(0, 2, False), mask=(True, True), seed=1)
@example(N=2, C=6, H=20, W=9, Ho=24, Wo=3, dtype=np.float16, combo=(2, 0, True), mask=(True, True), seed=2)
def test_workspace_within_the_largest_input_for_every_shape(N, C, H, W, Ho, Wo, dtype, combo, mask, seed):
    paths = check_bound_and_bits((N, C, H, W, Ho, Wo), dtype, *combo, mask, seed)
    names = {True: "whole-plane pass", False: "banded / point-parallel", None: "no block pass"}
    split = mask == (True, True) and combo[0] != 1 and C in specs.SPLIT_POINTS_CHANNELS
    event(f"call: {names[paths[0]]}{' (dx alone, then grad_grid point-parallel)' if split else ''}; "
          f"batch of {BATCH}: {names[paths[1]]}")


# ----------------------------------------------------------------------------- GPUs (Vulkan)
# The GPU forms (templates/grid_sampler_2d_backward/gpu_executable.mlir.j2) in their default, atomic dx mode (float32
# atomics on Vulkan): the grid gradient is one point-parallel dispatch whose result IREE writes
# into grad_grid's storage (no partial sums), so grad_grid alone needs no workspace in any
# dtype; float32 dx accumulates in one dx-sized buffer (IREE 3.13 copies a dispatch result tied
# to an operand from a transient into the caller's storage): the input's bytes, in whole 64-byte
# units (so up to 63 bytes beyond it).  Half
# types' float32 accumulator (twice the input) and the deterministic mode's copies are not
# bounded (docs/targets.md).  Oracle: the float64 reference within test_dtypes'
# derived bound (the atomic sums' order varies, so there are no bits to compare).
GPU = "vulkan"
GPU_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def _check_against_reference(out, want, S, n, A_, dtype, what):
    """`out` within test_dtypes' derived bound of the float64 reference `want` (S, n, A_: its
    abs_sums); float32 results are stored as accumulated, so the float32 part of the bound."""
    from test_dtypes import check_f64, check_half, error_bound
    if np.dtype(dtype) == np.float64:
        check_f64(out, want, what)
    elif np.dtype(dtype) == np.float32:
        err = np.abs(out.astype(np.float64) - want)
        bound = error_bound(want, S, n, A_, np.float32)[1]
        assert np.all(err <= bound), (what, float(np.max(err - bound)))
    else:
        check_half(out, want, S, n, A_, dtype, what=what)


def _check_gpu_call(shape, dtype, mode, pad, ac, mask, seed):
    """Runs the call on the GPU; asserts its outputs against the float64 reference; returns
    (workspace bytes, the largest input's bytes)."""
    from conftest import require_device
    from test_dtypes import grid_abs_sums
    from aclnn_iree.ops import reference as ref
    require_device(GPU)
    go, x, grid = _arrays(np.random.default_rng(seed), shape, dtype)
    ws = _workspace(go, x, grid, mode, pad, ac, mask, device=GPU)
    ours = api.grid_sampler_2d_backward(go, x, grid, mode, pad, ac, output_mask=mask, device=GPU)
    wide = [a.astype(np.float64) for a in (go, x, grid)]
    want = ref.grid_sampler_2d_backward(*wide, mode, pad, ac)
    sums = grid_abs_sums(*wide, mode, pad, ac)
    for name, out, r, m in zip(("dx", "dgrid"), ours, want, mask):
        if not m:
            assert out is None
            continue
        _check_against_reference(out, r, *sums[name], dtype, name)
    return ws, max(a.nbytes for a in (go, x, grid))


@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 2), C=st.integers(1, 5), H=st.integers(1, 24), W=st.integers(1, 24),
       Ho=st.integers(1, 16), Wo=st.integers(1, 16), dtype=st.sampled_from(GPU_DTYPES),
       combo=st.sampled_from(COMBOS),
       mask=st.sampled_from(MASKS), seed=st.integers(0, 2**16))
def test_gpu_workspace_of_the_atomic_form(N, C, H, W, Ho, Wo, dtype, combo, mask, seed):
    ws, largest = _check_gpu_call((N, C, H, W, Ho, Wo), dtype, *combo, mask, seed)
    if not mask[0]:
        assert ws == 0  # grad_grid alone: written straight into the caller's storage
    elif np.dtype(dtype) == np.float32:
        assert ws <= _units(largest), (ws, largest)
    event("grad_grid alone" if not mask[0] else np.dtype(dtype).name)


def test_gpu_grid_gradient_needs_no_partial_sums_beyond_one_block():
    """More channels than a GPU block (256): the blocks are still summed in order within the
    point's invocation, with no workspace; a 3-channel 224 x 224 image with both outputs in
    float32 stays within its input (it took 1.67x with the partial sums)."""
    _check_gpu_call((1, 300, 6, 5, 3, 4), np.float32, 0, 2, False, (False, True), seed=3)
    ws, largest = _check_gpu_call((1, 300, 6, 5, 3, 4), np.float32, 2, 0, True, (True, True), seed=4)
    assert ws == _units(6 * 5 * 300 * 4)  # dx's accumulator alone
    go, x, grid = _arrays(np.random.default_rng(5), (1, 3, 224, 224, 224, 224), np.float32)
    assert _workspace(go, x, grid, 0, 0, False, (True, True), device=GPU) == x.nbytes


# ----------------------------------------------------------------------------- GPU upsample
# The GPU upsample meets its two separable passes in an intermediate t (in the compute type) in
# the workspace, the smaller of Ho x W and H x Wo per plane; where even that exceeds
# grad_output's bytes (the forward down-samples both axes; in half types, whose t is float32,
# up-samples each by less than 2x), no t is kept and the
# second pass computes the t values it reads itself (t_rows in the template): the workspace is
# then the window tables alone.  Oracle: the float64 reference within test_dtypes' bound.
UPSAMPLE_CASES = [  # (N, C, Ho, Wo, H, W): the forward's output and input planes
    (2, 16, 4, 4, 64, 64),   # forward 16x down on both axes: t would be 16x grad_output
    (1, 3, 9, 12, 13, 17),   # down < 2x on both axes (t would exceed grad_output)
    (2, 4, 16, 16, 16, 16),  # no resize: t as large as grad_output (kept; half types: twice, not kept)
    (1, 2, 40, 3, 21, 5),    # one axis up, the other down
]


def _table_bytes_max(Ho, Wo, H, W, ct_bytes):
    """The window tables at most: a start (i64) and K <= out weights per input index."""
    return _units(8 * H) + _units(ct_bytes * Ho * H) + _units(8 * W) + _units(ct_bytes * Wo * W)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", UPSAMPLE_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gpu_upsample_intermediate_never_exceeds_grad_output(case, layout, dtype):
    from conftest import require_device
    from test_dtypes import UpsampleCase
    require_device(GPU)
    N, C, Ho, Wo, H, W = case
    go = np.random.default_rng(sum(case)).standard_normal((N, C, Ho, Wo))
    ucase = UpsampleCase("gpu", go, (H, W), False, layout)
    (g,) = ucase.inputs(dtype)
    osz, isz = ucase.sizes
    arr, lsz = (g, isz) if layout == "NCHW" else (g.transpose(0, 2, 3, 1), (N, H, W, C))
    status, stream = A.aclrtCreateStream(GPU)
    assert status == A.ACLNN_SUCCESS
    out = np.empty(lsz, dtype)
    status, ws, ex = A.aclnnUpsampleBilinear2dBackwardV2GetWorkspaceSize(
        A.aclCreateTensor(arr, layout, stream=stream), A.aclCreateIntArray(list(osz)), A.aclCreateIntArray(list(lsz)),
        False, 0.0, 0.0, A.aclCreateTensor(out, layout, stream=stream))
    assert status == A.ACLNN_SUCCESS, A.aclGetRecentErrMsg()
    A.aclDestroyAclOpExecutor(ex)
    ct = 8 if np.dtype(dtype) == np.float64 else 4
    t_old = N * C * min(Ho * W, H * Wo) * ct  # the smaller intermediate, as it was always kept
    assert ws <= _units(g.nbytes) + _table_bytes_max(Ho, Wo, H, W, ct), (ws, g.nbytes)
    if t_old > g.nbytes:  # no t at all (the first case: the tables are 3 KiB, t was 32 KiB)
        assert ws <= _table_bytes_max(Ho, Wo, H, W, ct), (ws, t_old)
    ours = api.upsample_bilinear2d_backward(arr, osz, lsz, False, memory_format=layout, device=GPU)
    if layout == "NHWC":
        ours = ours.transpose(0, 3, 1, 2)
    want = ucase.reference(dtype)["dx"]
    _check_against_reference(ours, want, *ucase.abs_sums(dtype)["dx"], dtype, "dx")
