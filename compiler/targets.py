"""Compile targets: the iree-compile flags of each target device, and the runtime driver that runs it."""
from __future__ import annotations

import dataclasses
import functools
import os
import platform
import re

__all__ = ["Target", "TARGETS", "target_for_driver", "get_target", "build_args", "CPU_ARCH_ENV", "CpuArchError", "cpu_isa",
           "cpu_gathers", "CUDA_ARCHS", "llvm_cpu_names", "arch_problem"]

# f64 kernels must stay f64: IREE demotes f64 to f32 by default (docs/iree-notes.md#float64-demotion).
_COMMON = ("--iree-input-demote-f64-to-f32=false",)

# Features that gave right answers for f32/f16/bf16/f64 on Mesa's lavapipe
# (docs/iree-notes.md#vulkan-and-lavapipe).
# Plus f32 atomic add (SPV_EXT_shader_atomic_float_add), which lavapipe and desktop
# GPUs have; f64 atomic add is rarer (lavapipe lacks it), so f64 dx is ordered there.
VULKAN_PORTABLE_FEATURES = (
    "spirv:v1.3,cap:Shader,cap:Float16,cap:Float64,cap:Int16,cap:Int64,"
    "cap:StorageBuffer16BitAccess,ext:SPV_KHR_16bit_storage,ext:SPV_KHR_storage_buffer_storage_class,"
    "ext:SPV_EXT_shader_atomic_float_add,cap:AtomicFloat32AddEXT"
)


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target: its name (the IREE backend), the driver that runs it, and its flags.

    `arch` names the CPU or GPU the code is compiled for; it is part of the
    artifact's cache key and recorded in the manifest.
    """

    name: str
    driver: str
    arch: str

    @property
    def is_gpu(self) -> bool:
        """GPU targets get the GPU forms of the kernels (one invocation per work item)."""
        return self.name in ("vulkan-spirv", "cuda", "rocm", "metal-spirv")

    @property
    def tuned(self) -> bool:
        """Whether the hand-written (tuned) forms exist for the target (compiler/specs.py FORMS);
        elsewhere every kernel takes its linalg form."""
        return self.name in _TUNED_TARGETS

    @property
    def dtypes(self) -> tuple:
        """The dtypes its modules can compute: VMVX's VM has no f16, bf16 or f64 arithmetic
        (IREE 3.13 refuses to lower arith.extf from f16 and sitofp to f64 there), Metal no f64."""
        return {"vmvx": ("float32",), "metal-spirv": ("float32", "float16", "bfloat16")}.get(
            self.name, ("float32", "float16", "bfloat16", "float64"))

    @property
    def fused_fma(self) -> bool:
        """Whether the target's fma rounds once.  Vulkan's precision rules let it be a
        multiply and an add (lavapipe's is, in f32 and f64), so its kernels emulate it."""
        return self.name != "vulkan-spirv"

    @property
    def float_atomics(self) -> frozenset:
        """Element types the target can add atomically in device memory."""
        if self.name == "cuda":
            return frozenset({"f32", "f64"})
        if self.name == "vulkan-spirv" and "AtomicFloat32AddEXT" in self.arch:
            return frozenset({"f32"})  # IREE's named GPU profiles (ampere, rdna3, ...) lack it
        return frozenset()

    @property
    def flags(self) -> tuple:
        if self.name == "llvm-cpu":
            return ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
                    f"--iree-llvmcpu-target-cpu={self.arch}") + _COMMON
        if self.name == "vulkan-spirv":
            if self.arch.startswith("spirv:"):  # a feature string (the portable profile)
                return ("--iree-hal-target-device=vulkan", f"--iree-vulkan-target-features={self.arch}") + _COMMON
            return ("--iree-hal-target-device=vulkan", f"--iree-vulkan-target={self.arch}") + _COMMON
        if self.name == "cuda":
            return ("--iree-hal-target-device=cuda", f"--iree-cuda-target={self.arch}") + _COMMON
        if self.name == "rocm":
            return ("--iree-hal-target-device=hip", f"--iree-rocm-target={self.arch}") + _COMMON
        if self.name == "metal-spirv":
            return ("--iree-hal-target-device=metal", f"--iree-metal-target-platform={self.arch}") + _COMMON
        if self.name == "vmvx":
            return ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx") + _COMMON
        raise ValueError(f"unknown target {self.name!r}")


# Default arch per target.  llvm-cpu "host" builds for this machine's CPU.
TARGETS = {
    "llvm-cpu": Target("llvm-cpu", "local-task", "host"),
    "vulkan-spirv": Target("vulkan-spirv", "vulkan", VULKAN_PORTABLE_FEATURES),
    "cuda": Target("cuda", "cuda", "sm_80"),
    # AMD GPUs (IREE's HIP driver): an MI300-class (CDNA3) default; --gpu-arch names another
    # (gfx1100: RDNA3).  Apple GPUs: Metal on macOS (--gpu-arch ios for iOS).  VMVX: IREE's
    # portable VM-based CPU target, run by the local-task driver on any CPU (device "vmvx").
    "rocm": Target("rocm", "hip", "gfx942"),
    "metal-spirv": Target("metal-spirv", "metal", "macos"),
    "vmvx": Target("vmvx", "vmvx", "vmvx"),
}
# The targets the hand-written forms compile for: the CPU forms for llvm-cpu, the GPU forms
# (written for Vulkan and CUDA) for every GPU target IREE accepts them on; not vmvx.
_TUNED_TARGETS = ("llvm-cpu", "vulkan-spirv", "cuda", "rocm", "metal-spirv")

_DRIVER_TO_TARGET = {"local-task": "llvm-cpu", "local-sync": "llvm-cpu", "vulkan": "vulkan-spirv", "cuda": "cuda",
                     "hip": "rocm", "metal": "metal-spirv", "vmvx": "vmvx"}


# What an arch given on the command line may look like, per target, and an example of each.
_ARCH_FORMS = {"llvm-cpu": re.compile(r"[A-Za-z0-9_.+-]+"), "vulkan-spirv": re.compile(r"[A-Za-z0-9_.+:,-]+"),
               "cuda": re.compile(r"sm_[0-9]{2,3}a?"), "rocm": re.compile(r"gfx[0-9a-f]{3,4}|[a-z][a-z0-9]*"),
               "metal-spirv": re.compile(r"macos|ios"), "vmvx": re.compile(r"vmvx")}
_ARCH_EXAMPLES = {"llvm-cpu": "x86-64-v3", "vulkan-spirv": "ampere", "cuda": "sm_86", "rocm": "gfx1100",
                  "metal-spirv": "ios", "vmvx": "vmvx"}


def get_target(name: str, arch: str | None = None) -> Target:
    """The target called `name` (a key of TARGETS), optionally for another arch: a CPU name
    (x86-64-v3), an IREE Vulkan profile (ampere), a CUDA sm_NN, an AMD gfx target (gfx1100) or a
    Metal platform (macos, ios).  Raises
    ValueError for an unknown target or an arch of the wrong form."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    t = TARGETS[name]
    if arch and not _ARCH_FORMS[name].fullmatch(arch):
        raise ValueError(f"{arch!r} is not a {name} architecture (e.g. {_ARCH_EXAMPLES[name]})")
    return dataclasses.replace(t, arch=arch) if arch else t


# The sm_NN that iree-base-compiler 3.13's CUDA target knows (IREE's KnownTargets.cpp; found by
# compiling a one-dispatch module for each of sm_20 .. sm_130).  Others fail on every module
# with "missing GPU target in #hal.executable.target" and the module's MLIR (no sm_90 or sm_100).
CUDA_ARCHS = ("sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_120",
              "sm_121")

# One elementwise dispatch: what arch_problem compiles to ask iree-compile whether it knows an arch.
_PROBE_MLIR = ("func.func @f(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
               "  %c = arith.addf %a, %b : tensor<4xf32>\n  return %c : tensor<4xf32>\n}\n")


def _iree_compile(args: list, source: str):
    """iree-compile run on `source` (stdin) with `args`: the CompletedProcess, or None without the compiler."""
    import subprocess
    try:
        from iree.compiler.tools.binaries import find_tool
        return subprocess.run([find_tool("iree-compile"), *args, "-", "-o", os.devnull], input=source,
                              capture_output=True, text=True, timeout=120)
    except Exception:  # noqa: BLE001 - no compiler (ImportError, its binary missing), a hung one
        return None


@functools.lru_cache(maxsize=None)
def llvm_cpu_names() -> tuple:
    """The LLVM CPU names iree-compile accepts for llvm-cpu on this machine's instruction set, as
    it lists them for a CPU it does not know (asked with `help`, about 0.02 s); `host` and
    `generic` are accepted too.  () when the compiler is missing or lists none."""
    flags = [f for f in TARGETS["llvm-cpu"].flags if not f.startswith("--iree-llvmcpu-target-cpu=")]
    p = _iree_compile([*flags, "--iree-llvmcpu-target-cpu=help", "--compile-to=executable-sources"], _PROBE_MLIR)
    m = re.search(r"List of accepted CPUs: (.*)", p.stderr) if p is not None else None
    return tuple(n.strip() for n in m.group(1).split(",") if n.strip()) if m else ()


@functools.lru_cache(maxsize=None)
def _probe_fails(flags: tuple) -> bool:
    """Whether iree-compile fails on the probe module with `flags` (False without the compiler)."""
    p = _iree_compile(list(flags), _PROBE_MLIR)
    return p is not None and p.returncode != 0


def arch_problem(target: Target) -> str | None:
    """Why iree-compile would fail every module for `target`'s arch (a CPU it does not know, an
    sm_NN its CUDA target lacks, a Vulkan profile it has no table for), asked before any kernel
    compiles, or None.  The default archs are not asked; nothing is, without the compiler."""
    if target.arch == TARGETS[target.name].arch:
        return None
    if target.name == "llvm-cpu":
        if target.arch in ("host", "generic"):
            return None
        names = llvm_cpu_names()
        if names:  # its list: 0.02 s for every CPU, where a probe compile takes 0.1 s for one
            return None if target.arch in names else f"{target.arch!r} is not a CPU iree-compile knows for " \
                                                     f"{platform.machine()}"
    elif target.name == "cuda" and target.arch in CUDA_ARCHS:
        return None
    if _probe_fails(target.flags):
        return f"{target.arch!r} is not a {target.name} architecture iree-compile knows"
    return None


CPU_ARCH_ENV = "ACLNN_IREE_CPU_ARCH"


class CpuArchError(ValueError):
    """ACLNN_IREE_CPU_ARCH holds something that is not an LLVM CPU name."""


def cpu_isa() -> str | None:
    """The instruction set llvm-cpu modules are compiled for: "x86", "aarch64", or None for
    another.  No target triple is passed, so iree-compile targets the host's (a named
    `--target-cpu` picks a CPU of that family); the templates save and set its
    floating-point control register in each CPU dispatch (templates/_common.mlir.j2)."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "x86"
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    return None


# LLVM CPU names (and levels) whose x86 CPUs all have AVX2, hence its gather instructions.
_AVX2_CPUS = frozenset({"x86-64-v3", "x86-64-v4", "haswell", "broadwell", "skylake", "skylake-avx512", "cascadelake",
                        "cooperlake", "cannonlake", "icelake-client", "icelake-server", "tigerlake", "rocketlake",
                        "alderlake", "raptorlake", "meteorlake", "sapphirerapids", "emeraldrapids", "graniterapids",
                        "znver1", "znver2", "znver3", "znver4", "znver5"})


def cpu_gathers(target=None) -> bool:
    """Whether llvm-cpu code for `target` (default: this machine's CPU) may use x86's AVX2
    gather instructions (templates/grid_sampler_2d: iree-compile fails on them for a CPU
    without AVX2): the host's CPU as iree-cpuinfo reports it, or a named CPU known to have
    AVX2; False on other instruction sets and for CPUs not known to have it."""
    if cpu_isa() != "x86":
        return False
    arch = "host" if target is None else target.arch
    if arch == "host":
        from .key import host_feature_table
        table = host_feature_table()
        return bool(table and table.get("avx2"))
    return arch in _AVX2_CPUS


def target_for_driver(driver: str) -> Target:
    """The compile target whose modules the IREE runtime driver `driver` runs.

    CPU drivers run modules for the host CPU, or for the LLVM CPU named by the environment
    variable ACLNN_IREE_CPU_ARCH (read when called), e.g. `x86-64-v3`: modules built
    with `aclnn-iree build --target-cpu x86-64-v3` run on any machine with AVX2.
    """
    base = driver.split(":", 1)[0]
    if base not in _DRIVER_TO_TARGET:
        raise ValueError(f"unknown device {driver!r}; known: {', '.join(_DRIVER_TO_TARGET)}")
    target = TARGETS[_DRIVER_TO_TARGET[base]]
    cpu = os.environ.get(CPU_ARCH_ENV, "").strip()
    if target.name == "llvm-cpu" and cpu:
        try:  # get_target checks the form, as for --target-cpu: it names a store folder, no path may hide in it
            return get_target("llvm-cpu", cpu)
        except ValueError:
            raise CpuArchError(f"{CPU_ARCH_ENV}={cpu!r} is not an LLVM CPU name (letters, digits and _.+-, "
                               f"e.g. {_ARCH_EXAMPLES['llvm-cpu']}); unset it to run modules built for "
                               "this CPU") from None
    return target


def build_args(target: Target, forms=("tuned",)) -> str:
    """The `aclnn-iree build` arguments that build modules for `target` in the kernel `forms`
    (specs.FORMS entries; `--form` only where the build's default, the tuned form where the
    target has one, would not build them)."""
    args = f"--target {target.name}"
    if target.arch != TARGETS[target.name].arch:
        args += f" --{'target-cpu' if target.name == 'llvm-cpu' else 'gpu-arch'} {target.arch}"
    forms = set(forms)
    if target.tuned and "linalg" in forms:
        args += " --form " + ("linalg" if forms == {"linalg"} else "all")
    return args
