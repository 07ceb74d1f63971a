#!/usr/bin/env bash
# Prepares, on a machine with the compiler and a network, what scripts/gpu_check.sh needs on a
# GPU machine that has neither (the lent H200s: Python 3.12 with PyTorch, no network, 64 MiB
# of files may travel).  Writes, under .gpu/ (ignored by git):
#   .gpu/whl/        wheels: aclnn-iree itself, iree-base-runtime and platformdirs for
#                    CPython $PYVER on manylinux x86-64 (the compiler, 84 MB, stays here)
#   .gpu/artifacts/  every module for cuda (sm_80 PTX) and for llvm-cpu x86-64-v3 (AVX2:
#                    any x86-64 server CPU), the CPU device the GPU suites compare against
# Then the GPU machine runs: bash scripts/gpu_check.sh   (with .gpu carried).
#
#   bash scripts/prepare_gpu_check.sh          # about 10 minutes on 2 cores, ~25 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${PYVER:-3.12}"
. .venv/bin/activate 2>/dev/null || true
runtime_version="$(python -c 'from importlib.metadata import version; print(version("iree-base-runtime"))')"
rm -rf .gpu/whl
mkdir -p .gpu/whl .gpu/artifacts
echo "== wheels for CPython $PYVER: iree-base-runtime $runtime_version, platformdirs, aclnn-iree"
python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .gpu/whl "iree-base-runtime==$runtime_version" platformdirs 2>&1 \
    | grep -v "^WARNING: Location" || true
python -m pip wheel -q --no-deps --no-build-isolation -w .gpu/whl . 2>&1 | grep -v "^WARNING: Location" || true
ls .gpu/whl
echo "== modules for cuda and for llvm-cpu x86-64-v3"
aclnn-iree build --target cuda --out .gpu/artifacts --no-progress | tail -1
aclnn-iree build --target llvm-cpu --target-cpu x86-64-v3 --out .gpu/artifacts --no-progress | tail -1
find .gpu -name '*.mlir' -delete  # the manifest keeps each source's sha256; the sources need not travel
du -sh .gpu/whl .gpu/artifacts .gpu
size_mib=$(du -sm .gpu | cut -f1)
if [ "$size_mib" -gt 56 ]; then
    echo "error: .gpu is ${size_mib} MiB; with the repository it must stay under the 64 MiB that travel" >&2
    exit 1
fi
echo "ready: run scripts/gpu_check.sh on the GPU machine with .gpu carried"
