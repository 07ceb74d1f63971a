"""Named regression tests for bugs found by attacks on the library (each reproduces one)."""
import multiprocessing as mp

import numpy as np
import pytest

import aclnn_iree
from aclnn_iree import AclnnError
from aclnn_iree import aclnn as A
from aclnn_iree import reference as R


# IREE caps a dispatch at 65535 workgroups per dimension: a workgroup grid of (.., .., N)
# silently dropped every image n >= 65536.  Dispatches now stride over their work.
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_upsample_more_than_65535_images(layout):
    N = 65537
    go = np.arange(N * 9, dtype=np.float32).reshape(N, 1, 3, 3) % 7
    want = R.upsample_bilinear2d_backward(go, (3, 3), (N, 1, 2, 2), False)
    if layout == "NHWC":
        got = aclnn_iree.upsample_bilinear2d_backward(go.transpose(0, 2, 3, 1).copy(), (3, 3), (N, 2, 2, 1),
                                                     memory_format="NHWC").transpose(0, 3, 1, 2)
    else:
        got = aclnn_iree.upsample_bilinear2d_backward(go, (3, 3), (N, 1, 2, 2))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_grid_sampler_more_than_65535_images(mask):
    N = 65537
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, 1, 2, 2)).astype(np.float32)
    grid = rng.uniform(-1, 1, (N, 1, 2, 2)).astype(np.float32)
    go = rng.standard_normal((N, 1, 1, 2)).astype(np.float32)
    dx, dg = aclnn_iree.grid_sampler_2d_backward(go, x, grid, 0, 1, False, mask)
    rdx, rdg = R.grid_sampler_2d_backward(go, x, grid, 0, 1, False)
    for got, want in ((dx, rdx), (dg, rdg)):
        if got is not None:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
