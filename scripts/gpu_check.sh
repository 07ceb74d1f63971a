#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU (CI never has one): installs the package,
# runs the numerical suites on the `cuda` device (beside the CPU, which they compare
# against) and the benchmark, in about 5 minutes.  Prints everything it runs; exits
# non-zero when a test fails or no CUDA device is found.
#
#   bash scripts/gpu_check.sh            # from the repository root
#
# Kernels compile for cuda (sm_80 PTX, which newer GPUs JIT) on first use into a fresh
# cache; the CPU ones too.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || { echo "no nvidia-smi: no NVIDIA GPU here"; exit 2; }
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
. .venv/bin/activate
pip install -q --upgrade pip >/dev/null 2>&1 || true
pip install -q -e '.[test]'
export ACLNN_IREE_CACHE="${ACLNN_IREE_CACHE:-$(mktemp -d)}"
python - <<'PY'
from aclnn_iree.runtime.device import get_device
d = get_device("cuda")
print("== IREE cuda device:", d.hal)
PY
echo "== all artifacts compile for cuda"
aclnn-iree build --target cuda --out "$ACLNN_IREE_CACHE/aot" --no-progress --jobs "$(nproc)" | tail -2
echo "== numerical suites on cuda (the CPU is the cross-device reference)"
# -x: stop at the first failure; the CPU-only instances are deselected to save time.
ACLNN_IREE_TEST_DEVICES=cuda timeout 240 python -m pytest -q -x -p no:cacheprovider \
    tests/test_devices.py tests/test_grid_sampler.py tests/test_dtypes.py \
    -k "not test_every_gpu_artifact_compiles and not test_named_gpu_arch" 2>&1 | tail -25
echo "== PyTorch integration on CUDA tensors (DLPack to IREE's cuda device, the fallback)"
timeout 240 python -m pytest -q -x -p no:cacheprovider tests/test_torch.py -k cuda 2>&1 | tail -15
echo "== benchmark on cuda (PyTorch CPU beside it)"
timeout 120 aclnn-iree bench --device cuda --quick --no-compile --repeats 10 2>&1 | tail -30
