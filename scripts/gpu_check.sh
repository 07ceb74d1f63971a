#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (CI never has one): runs the numerical suites on
# the `cuda` device (beside the CPU, which they compare against), the PyTorch integration on
# CUDA tensors (both launches of ours), the benchmarks beside PyTorch eager and torch.compile and
# a per-call breakdown of our time against PyTorch's, in under 12 minutes.
# Prints everything it runs; exits non-zero when a test fails or no CUDA device is found.
#
#   bash scripts/gpu_check.sh               # from the repository root
#   bash scripts/gpu_check.sh --rehearse    # the same steps with the CPU in place of cuda,
#                                           # to try the script (and .gpu/) before GPU time
#
# Two ways to get the package there:
# - with .gpu/ from scripts/prepare_gpu_check.sh (the lent GPU machines: no network, no
#   compiler): the carried wheels are installed into /tmp/site and the carried modules run
#   offline (cuda sm_80 PTX, which newer GPUs JIT; llvm-cpu x86-64-v3 for the CPU);
# - otherwise a virtual environment with `pip install -e .[test]` (a network), and kernels
#   compile on first use into a fresh cache.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
DEV=cuda
if [ "${1:-}" = "--rehearse" ]; then
    DEV=local-task
    export VK_ICD_FILENAMES=/nonexistent  # no Vulkan either: the GPU-only tests skip, as on a CPU box
fi
failed=0
echo "== machine"
if [ "$DEV" = cuda ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || { echo "no nvidia-smi: no NVIDIA GPU here"; exit 2; }
fi
export PYTHONUNBUFFERED=1
if [ -d .gpu/whl ] && [ -d .gpu/artifacts ]; then
    echo "== installing the carried wheels into /tmp/site (no network, no compiler)"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .gpu/whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
    export ACLNN_IREE_ARTIFACTS="$REPO/.gpu/artifacts" ACLNN_IREE_CPU_ARCH=x86-64-v3 ACLNN_IREE_OFFLINE=1
    export ACLNN_IREE_CACHE="$(mktemp -d)"
    PY=python3
else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    . .venv/bin/activate
    pip install -q -e '.[test]' || exit 3
    export ACLNN_IREE_CACHE="${ACLNN_IREE_CACHE:-$(mktemp -d)}"
    PY=python
fi
# Run from outside the checkout: its aclnn_iree/ folder is not the installed package.
cd /tmp
DEV=$DEV $PY - <<'PY' || exit 4
import os, aclnn_iree, iree.runtime, torch
from aclnn_iree.runtime.device import get_device
print("== aclnn_iree from", aclnn_iree.__file__, "| torch", torch.__version__, "cuda", torch.cuda.is_available())
print("== IREE device:", get_device(os.environ["DEV"]).hal)
PY
# GPU_CHECK_LOG=FILE: every step's whole output goes there too (the console gets each one's tail).
LOG="${GPU_CHECK_LOG:-/dev/null}"
run() {  # name, timeout (s), command...
    local name="$1" limit="$2"; shift 2
    echo "== $name" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -25
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "== $name: FAILED (exit $rc)"; failed=1; }
}
# JAX (where installed) must not take three quarters of the GPU's memory at its first use.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# --maxfail: one device-time slot should show every kind of failure, not only the first;
# compile-only tests are deselected (the modules came built); addopts without pyproject's -n:
# one process, one CUDA context, timings as the earlier runs, and no pytest-xdist needed (the
# GPU machines' Python may lack it; .gpu/whl does not carry it).
run "numerical suites on $DEV (the CPU is the cross-device reference)" 210 \
    env ACLNN_IREE_TEST_DEVICES=$DEV $PY -m pytest -q -o "addopts=-m 'not slow'" -rf --maxfail=30 -p no:cacheprovider --rootdir "$REPO" \
    "$REPO/tests/test_devices.py" "$REPO/tests/grid_sampler_2d_backward/test_grid_sampler.py" "$REPO/tests/test_dtypes.py" \
    -k "not artifact_compiles and not artifacts_compile and not test_named_gpu_arch and not ptxas"
run "PyTorch integration on CUDA tensors (DLPack to IREE's cuda device)" 90 \
    $PY -m pytest -q -o "addopts=-m 'not slow'" -rf -x -p no:cacheprovider --rootdir "$REPO" "$REPO/tests/test_torch.py" -k cuda
# --peers: torch.compile on the same device too, and JAX where installed (the H200 image has it).
run "benchmark on $DEV (PyTorch eager and torch.compile on the same device beside it)" 150 \
    $PY -m aclnn_iree bench --device $DEV --quick --no-compile --repeats 10 --peers
# The training step on CUDA tensors: ours through IREE's runtime (PyTorch's stream synchronised
# around each call) and launched on PyTorch's stream (ACLNN_IREE_CUDA_LAUNCH=stream), beside
# PyTorch eager and torch.compile.  test_torch.py's cuda tests above check the stream launch's
# results (and a CUDA graph's capture of it).
if [ "$DEV" = cuda ]; then
    run "training steps on CUDA tensors (ours: IREE's launch and the stream launch)" 150 \
        $PY -m aclnn_iree bench --op torch --device cuda --quick --repeats 6
fi
# Per call, where our time goes against PyTorch's (host, IREE's launch, GPU kernels, memsets and
# copies by name), then the same with IREE's CUDA graphs (--cuda_use_streams=false).
run "per-call breakdown (scripts/gpu_gap_probe.py)" 240 \
    $PY "$REPO/scripts/gpu_gap_probe.py" $([ "$DEV" = cuda ] || echo --rehearse)
exit $failed
