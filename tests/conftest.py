"""Shared pytest configuration: Hypothesis profiles and the device parametrisation.

Hypothesis: "ci" (the default): derandomized, so a CI run is reproducible; 300
examples per property (tests/test_properties.py spreads them over its
parametrisations); no deadline (kernels compile on first use); print_blob so a
failure prints the reproduction blob.  "dev": 10x the examples, randomized.
Select with HYPOTHESIS_PROFILE=dev.

Devices: a test module that uses the `device` fixture (the numerical suites do,
through an autouse fixture) runs once per IREE device in DEVICES: the CPU
(local-task) and Vulkan (on a machine without a GPU, Mesa's lavapipe, which
.ci/run installs).  A missing Vulkan device skips those tests with the reason,
except under CI=true, where it fails them: CI must test Vulkan for real.  The first
test on a device compiles every module for it that no store holds, in parallel
(prepare_modules), instead of one at a time on first use.
ACLNN_IREE_TEST_DEVICES="local-task" (comma-separated) narrows the list.  The suites of the
operators with a linalg form also run once per form (the `kernel_form` fixture).

Order: the tests that may create the Vulkan device run last (pytest_collection_modifyitems).
IREE's Vulkan device on lavapipe busy-polls while it exists (measured: about 0.66 of a core,
idle, from its creation until it is destroyed), so every CPU test after it ran on what was
left of the two cores (the stereo job's fixture: 16-24 s alone, 95 s after the Vulkan tests).
"""
import contextlib
import functools
import inspect
import os

import pytest
from hypothesis import HealthCheck, settings

# function_scoped_fixture: the autouse device fixture is the same for every example.
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", derandomize=True, max_examples=300, deadline=None, print_blob=True,
                          suppress_health_check=_SUPPRESS)
settings.register_profile("dev", derandomize=False, max_examples=3000, deadline=None, print_blob=True,
                          suppress_health_check=_SUPPRESS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DEVICES = tuple(d for d in os.environ.get("ACLNN_IREE_TEST_DEVICES", "local-task,vulkan").split(",") if d)


@functools.lru_cache(maxsize=None)
def device_missing(name: str):
    """None when an IREE device `name` can be created here, else the reason it cannot."""
    from aclnn_iree.runtime.device import DeviceUnavailable, get_device
    try:
        get_device(name)
    except DeviceUnavailable as e:
        return str(e)
    return None


def require_device(name: str):
    """Skips (fails under CI=true) the calling test when device `name` is missing."""
    reason = device_missing(name)
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the suite on {name}, but: {reason} "
                    "(.ci/run installs Mesa's lavapipe: apt-get install -y mesa-vulkan-drivers libvulkan1)")
    pytest.skip(f"no {name} device here: {reason}")


@functools.lru_cache(maxsize=None)
def prepare_modules(name: str):
    """Compiles, all cores at once, every module the suites can load on device `name` that no
    store holds yet (runtime.store.prepare): on first use they would compile one at a time.
    Failed compiles are left to the tests that load them, which report them."""
    from aclnn_iree.compiler.compile import compiler_available
    from aclnn_iree.compiler.specs import all_specs
    from aclnn_iree.runtime import store
    if device_missing(name) is None and compiler_available() and not store.is_offline():
        gpu = is_gpu(name)
        specs = list(all_specs()) + list(all_specs(dtypes=LINALG_GPU_DTYPES if gpu else None, forms=("linalg",)))
        store.prepare(specs, name)


def no_loaded_modules(monkeypatch):
    """For the test's duration no module loaded earlier in this process answers a call (nor a
    kept executor's kernel: the generation moves on); restored afterwards."""
    from aclnn_iree.runtime import kernels
    monkeypatch.setattr(kernels, "_modules", {})
    monkeypatch.setattr(kernels, "generation", kernels.generation + 1)


@pytest.fixture(scope="session", params=DEVICES)
def device(request):
    """The IREE device a numerical test runs on (one test instance per device), with every
    module for it compiled."""
    require_device(request.param)
    prepare_modules(request.param)
    return request.param


# The dtypes the linalg forms' suites run in on GPU devices (lavapipe in CI): the half types'
# linalg path is the CPU's (the same template), checked there, and its Vulkan modules would
# cost CI a minute more to compile (pytest_collection_modifyitems skips those tests).
LINALG_GPU_DTYPES = ("float32", "float64")


def _half_dtype_param(value) -> bool:
    """Whether a test parameter names float16 or bfloat16 (a dtype, its name or its numpy type)."""
    import numpy as np
    if isinstance(value, str):
        return value in ("float16", "bfloat16")
    try:
        return np.dtype(value).name in ("float16", "bfloat16")
    except TypeError:
        return False


@pytest.fixture(params=("tuned", "linalg"))
def kernel_form(request, monkeypatch):
    """The kernel form a numerical test runs (one test instance per form): the tuned
    (hand-written) kernels, or the linalg forms, chosen through ACLNN_IREE_FORM as a user
    would (aclnn.current_form)."""
    monkeypatch.setenv("ACLNN_IREE_FORM", request.param)
    return request.param


def on_device(device: str):
    """(grid_sampler_2d_backward, upsample_bilinear2d_backward) of the Pythonic layer bound to
    `device`; on GPUs the grid sampler runs in the deterministic mode only when asked."""
    from aclnn_iree.core import api
    return (functools.partial(api.grid_sampler_2d_backward, device=device),
            functools.partial(api.upsample_bilinear2d_backward, device=device))


def is_gpu(device: str) -> bool:
    """Whether the IREE device `device` runs the GPU forms of the kernels."""
    from aclnn_iree.compiler.targets import target_for_driver
    return target_for_driver(device).is_gpu


def flushes_subnormals(device: str) -> bool:
    """Whether our kernels on `device` flush subnormals: the linalg forms (IREE's own code
    generation) on IREE's CPU executors, which run dispatches with FTZ and DAZ set; the tuned
    CPU kernels clear both for their own bodies (docs/semantics.md#subnormals)."""
    from aclnn_iree.core import aclnn
    return not is_gpu(device) and (aclnn.current_form() == "linalg" or device == "vmvx")


def flushed(a, compute=None):
    """`a` with its subnormals (those of the compute type: float32 for narrower types) as zeros
    of their sign, what FTZ and DAZ make of them; NaN and infinities kept."""
    import numpy as np
    a = np.asarray(a)
    ct = compute or (np.float64 if a.dtype == np.float64 else np.float32)
    tiny = float(np.finfo(ct).smallest_normal)
    with np.errstate(invalid="ignore"):
        small = (np.abs(a.astype(np.float64)) < tiny) & (a != 0)
    return np.where(small, np.copysign(0.0, a.astype(np.float64)).astype(a.dtype), a)


@contextlib.contextmanager
def torch_like_ours(torch, device: str):
    """PyTorch's CPU kernels in the floating-point environment ours run in on `device`:
    subnormals flushed (torch.set_flush_denormal, on one thread: it sets the calling thread's
    only) where ours flush them (flushes_subnormals), else as they are."""
    if not flushes_subnormals(device):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _may_use_vulkan(item) -> bool:
    """Whether a test may create the Vulkan device: by its id (the `device` parameter, its
    name), a fixture, or the device named in its code (a GPU constant, require_device)."""
    if "vulkan" in item.nodeid or "vulkan" in getattr(item, "fixturenames", ()):
        return True
    try:
        source = inspect.getsource(item.function)
    except (AttributeError, OSError, TypeError):
        return False
    return "vulkan" in source or "GPU" in source


@pytest.hookimpl(trylast=True)  # after pytest's own grouping by the `device` parameter
def pytest_collection_modifyitems(session, config, items):
    """The tests that may create the Vulkan device last (stable otherwise): see the module
    docstring.  Under ACLNN_IREE_TEST_DEVICES without vulkan nothing moves.  The linalg form's
    tests on GPU devices in a half dtype are skipped (LINALG_GPU_DTYPES)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("kernel_form") == "linalg" and params.get("device") not in (None, "local-task", "local-sync") \
                and any(_half_dtype_param(v) for k, v in params.items() if k not in ("device", "kernel_form")):
            item.add_marker(pytest.mark.skip(reason="the linalg form's half types run on CPU devices (LINALG_GPU_DTYPES)"))
    if "vulkan" not in DEVICES:
        return
    items[:] = sorted(items, key=_may_use_vulkan)
