"""`aclnn-iree` (also `python -m aclnn_iree`): build the kernels ahead of time, list them, run the
main job, benchmark.

    aclnn-iree build [--target llvm-cpu ...] [--op OP ...] [--dtype float32 ...] [--kernel GLOB ...]
                     [--jobs N] [--out DIR] [--target-cpu CPU] [--gpu-arch ARCH]
    aclnn-iree list  [--dir DIR] [--target ...] [--op ...] [--dtype ...] [--target-cpu CPU] [-v]
    aclnn-iree demo  [--out DIR] [--quick] [--kernels ours|torch|both] [--device DEV] [--photo]
    aclnn-iree bench [--quick] [--json FILE] [--threads N] [--device DEV] [--op OP|torch] ...
    aclnn-iree --version

`build` renders and compiles every specialisation of the chosen ops and dtypes
for the chosen targets into an artifact store (default: the project's
`artifacts/` in a source checkout, the per-user data directory otherwise: the
second place the runtime looks for modules), one vmfb per specialisation and
target, `--jobs` compiles at a time.  Valid artifacts are reused; a failed
compile is reported in a few lines (specialisation, command, the compiler's first
error line and the file holding its whole message) and the others go on; the
exit status is 1 when anything failed.

A user's mistake or an unavailable resource (a device, a file, an extra) is one
line on stderr, "error: ...", and exit status 1 (2 for a bad command line: an
option's value out of range, a CPU or GPU the compiler does not know, a --kernel
pattern that matches nothing); a traceback means a bug in aclnn-iree.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import warnings

__all__ = ["main", "build_parser"]

# The runtime's search order (runtime/store.py), for the --help of `build` and `list`.
_SEARCH_ORDER = ("Modules are looked for in $ACLNN_IREE_ARTIFACTS when set (a store it adds, hiding none), then in "
                 "the default store (the checkout's artifacts/, else the per-user data directory), then in the "
                 "compile cache ($ACLNN_IREE_CACHE, else ~/.cache/aclnn-iree), where first use compiles them.")


def _specs(ops, dtypes, kernels, form="tuned"):
    """The specialisations of `ops` and `dtypes` (None: all) in `form` ("tuned", "linalg" or
    "all") whose kernel name matches one of the shell patterns `kernels` (None: all).
    UsageError for a pattern that matches none of them: a typo would build or list nothing and
    look like success."""
    from .compiler.specs import FORMS, all_specs
    specs = list(all_specs(ops, dtypes, FORMS if form == "all" else (form,)))
    if not kernels:
        return specs
    for k in kernels:
        if not any(fnmatch.fnmatchcase(s.kernel_name, k) for s in specs):
            among = " of the chosen --op/--dtype" if ops or dtypes else ""
            raise UsageError(f"no kernel{among} matches {k!r} (`aclnn-iree list -v` lists them)")
    return [s for s in specs if any(fnmatch.fnmatchcase(s.kernel_name, k) for k in kernels)]


def _print_cpus() -> int:
    """`--target-cpu help`: the CPU names iree-compile accepts here, on one line (as llc's -mcpu=help)."""
    from .compiler.targets import llvm_cpu_names
    cpus = llvm_cpu_names()
    if not cpus:
        raise CliError("iree-compile lists no CPUs here (is iree-base-compiler installed?)")
    print("host (this machine's CPU), generic, " + ", ".join(cpus))
    return 0


def _targets(names, target_cpu, gpu_arch=None):
    """The targets `names` for the CPU `target_cpu` and the GPU `gpu_arch` (None: the defaults).

    Each named arch is checked before anything compiles: iree-compile answers an unknown CPU
    with LLVM's CPU list and an abort, an unknown sm_NN with ~200 lines of MLIR per module.
    UsageError (one line) for an arch of the wrong form or one the compiler does not know."""
    from .compiler.targets import CUDA_ARCHS, arch_problem, get_target
    names = list(dict.fromkeys(names))
    arch = {"llvm-cpu": target_cpu, "vulkan-spirv": gpu_arch, "cuda": gpu_arch, "rocm": gpu_arch,
            "metal-spirv": gpu_arch}
    targets = []
    for n in names:
        try:
            t = get_target(n, arch.get(n) or None)
        except ValueError as e:
            raise UsageError(f"--{'target-cpu' if n == 'llvm-cpu' else 'gpu-arch'} {e}") from None
        problem = arch_problem(t)
        if problem is None:
            targets.append(t)
            continue
        if t.name == "llvm-cpu":
            raise UsageError(f"--target-cpu {problem}; use host (this machine's CPU) or an LLVM CPU name such as "
                             f"x86-64-v3 (`aclnn-iree build --target-cpu help` lists them)")
        if t.name == "cuda":
            raise UsageError(f"--gpu-arch {problem}; it knows {', '.join(CUDA_ARCHS)} (e.g. sm_86)")
        if t.name == "rocm":
            raise UsageError(f"--gpu-arch {problem}; name an AMD GPU target, e.g. gfx942, gfx1100")
        raise UsageError(f"--gpu-arch {problem}; name one of IREE's Vulkan profiles, e.g. ampere, rdna3, valhall")
    return targets


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


class CliError(Exception):
    """A user's mistake or a missing resource: printed as one line, exit status 1."""


class UsageError(CliError):
    """A bad command line (an option's value the command cannot take): one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors (a bad option or value) are one line, "error: ...", exit status 2,
    as the command's own usage errors are (argparse would print its usage block first)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _count(low: int, high: int | None = None, note: str = ""):
    """An argparse type: a whole number from `low` to `high` (None: no limit), else argparse's
    one-line usage error naming the range (and `note`)."""
    def parse(text: str) -> int:
        # plain ASCII digits only: int() would also take ' 2', '+3', '1_000' and other scripts' digits
        n = int(text) if text.isascii() and text.isdigit() and len(text) < 20 else None
        if n is None or n < low or (high is not None and n > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"must be a whole number {span}{note}, got {text!r}")
        return n
    return parse


def _text(what: str):
    """An argparse type: a non-empty value (an empty --out would mean the default store, an
    empty --target-cpu the host's: a script's unset variable must not pick them silently)."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{what} is empty")
        if "\0" in text:
            raise argparse.ArgumentTypeError(f"{what} holds a NUL character")
        return text
    return parse


def _default_dir() -> str:
    from .runtime.store import PROJECT_ARTIFACTS
    return str(PROJECT_ARTIFACTS)


def _writable_dir(path: str, what: str) -> str:
    """`path` as an absolute directory that exists and takes a new file, else CliError
    (UsageError when it names something that is not a directory)."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):  # makedirs would say "File exists"
        raise UsageError(f"--out {path} is not a directory; name a directory (it is made when missing)")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".aclnn-iree-write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise CliError(f"cannot write the {what} into {path}: {e.strerror or e}; choose another directory "
                       f"with --out") from None
    return path


def _writable_file(path: str, what: str) -> str:
    """`path` as an absolute file that can be written (checked now, before the work), else CliError."""
    path = os.path.abspath(path)
    existed = os.path.exists(path)
    if existed and not os.path.isfile(path):  # a FIFO would block the open until a reader came
        raise UsageError(f"{path} is not a regular file: name a file for the {what}")
    try:
        with open(path, "a"):
            pass
        if not existed:
            os.unlink(path)
    except OSError as e:
        raise CliError(f"cannot write the {what} to {path}: {e.strerror or e}") from None
    return path


# The IREE drivers the layers name (a driver URI such as "vulkan://1" starts with one of them).
DEVICE_NAMES = ("local-task", "local-sync", "vulkan", "cuda", "hip", "metal", "vmvx")


def _check_device(name: str):
    """Raises UsageError (exit 2) for a name that is no IREE driver's, CliError (exit 1) for a
    driver this machine cannot open."""
    from .runtime.device import DeviceUnavailable, get_device
    if not any(name == d or name.startswith(d + "://") for d in DEVICE_NAMES):
        raise UsageError(f"--device {name!r} is not an IREE device this package uses; choose one of "
                         f"{', '.join(DEVICE_NAMES)}")
    try:
        get_device(name)
    except DeviceUnavailable as e:
        raise CliError(f"{e}; choose another with --device ({', '.join(DEVICE_NAMES)})") from None


def _first_error_line(message: str) -> str:
    """The line of a failed compile's message that says what went wrong: the compiler's first
    "error:" line (its source location cut to the line and column), else the first line."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.startswith("command: ")]
    for ln in lines:
        if "error:" in ln:
            where, _, what = ln.partition("error:")
            where = os.path.basename(where.strip().rstrip(":"))
            return f"{where}: error: {what.strip()}" if where else f"error: {what.strip()}"
    return lines[0] if lines else "(no message)"


def _report_failures(res, specs, targets, out: str):
    """Each failed compile in a few lines on stderr: the specialisation, the command, the first
    error line and the file that holds the whole message (a compiler's message can be hundreds
    of lines of MLIR), `<kernel>.compile-error.log` beside the module's source in the store.
    Such files of the modules that built this time are removed: they tell of an older build."""
    from .compiler.build import target_folder
    folders = {t.name: target_folder(t) for t in targets}
    by_name = {s.kernel_name: s for s in specs}
    failed = {(kernel, target) for kernel, target, _ in res.failed}

    def log_path(kernel, target):
        return os.path.join(out, folders.get(target, target), kernel + ".compile-error.log")
    for s in specs:
        for t in targets:
            if (s.kernel_name, t.name) not in failed:
                try:
                    os.unlink(log_path(s.kernel_name, t.name))
                except OSError:
                    pass
    for kernel, target, message in res.failed:
        print(f"\nFAILED {target}/{kernel}: {_first_error_line(message)}", file=sys.stderr)
        print(f"  specialisation: {by_name.get(kernel, kernel)!r}", file=sys.stderr)
        command = next((ln for ln in message.splitlines() if ln.startswith("command: ")), None)
        if command:
            print(f"  {command}", file=sys.stderr)
        path = log_path(kernel, target)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(message.rstrip() + "\n")
            print(f"  whole message ({len(message.splitlines())} lines): {path}", file=sys.stderr)
        except OSError as e:
            print(f"  (cannot write the whole message to {path}: {e.strerror or e})", file=sys.stderr)


def _cmd_build(args) -> int:
    from .compiler.build import ArtifactStore
    if args.target_cpu == "help":
        return _print_cpus()
    from .compiler.build import buildable_pairs
    specs = _specs(args.op, args.dtype, args.kernel, args.form)
    if not specs:
        print("error: no specialisation matches the given --op/--dtype/--kernel", file=sys.stderr)
        return 2
    targets = _targets(args.target or ["llvm-cpu"], args.target_cpu, args.gpu_arch)
    if args.target_cpu and not any(t.name == "llvm-cpu" for t in targets):
        print("warning: --target-cpu only applies to the llvm-cpu target", file=sys.stderr)
    if args.gpu_arch and not any(t.is_gpu for t in targets):
        print("warning: --gpu-arch only applies to GPU targets (vulkan-spirv, cuda, rocm, metal-spirv)",
              file=sys.stderr)
    out = _writable_dir(args.out or _default_dir(), "artifacts")
    store = ArtifactStore(out)
    total = len(buildable_pairs(specs, targets))
    tnames = ", ".join(t.name + (f" ({t.arch})" if t.name == "llvm-cpu" else "") for t in targets)
    print(f"building {len(specs)} specialisation(s) x {len(targets)} target(s) [{tnames}] into {out}",
          flush=True)
    for t in targets:
        notes = []
        if not t.tuned and any(not s.linalg for s in specs):
            notes.append("its kernels are the linalg forms (no tuned forms for it)")
        lacking = sorted({s.dtype for s in specs} - set(t.dtypes))
        if lacking:
            notes.append(f"skipping {', '.join(lacking)} (it computes {', '.join(t.dtypes)})")
        if notes:
            print(f"note: {t.name}: {'; '.join(notes)}")
    res = store.build(specs, targets, jobs=args.jobs, progress=not args.no_progress)
    _report_failures(res, specs, targets, out)
    print(f"\nsummary: compiled {res.compiled}, reused {res.reused}, failed {len(res.failed)} "
          f"of {total} in {res.seconds:.1f} s")
    for kernel, function, nbytes in res.spills:
        print(f"note: ptxas: cuda/{kernel} @{function} spills {nbytes} bytes of registers (see its manifest entry)")
    if total == 0:
        print("nothing to compile: no target computes these specialisations' dtypes (see the notes above)")
    elif res.compiled == 0 and not res.failed:
        print(f"nothing to compile: all {total} artifact(s) are up to date in {out}")
    if res.failed:
        print(f"{len(res.failed)} specialisation(s) failed to compile (see above)", file=sys.stderr)
        return 1
    return 0


def _list_stores(args) -> list:
    """(directory, what it is) of each store `list` reports: --dir alone, else every place the
    runtime searches, in its order (runtime.store.search_places)."""
    if args.dir:
        return [(os.path.abspath(args.dir), "")]
    from .core.install import source_checkout
    from .runtime.store import search_places
    what = {"explicit": "set_artifacts_dir", "env": "ACLNN_IREE_ARTIFACTS",
            "default": "the checkout's artifacts/" if source_checkout() else "the default store",
            "cache": "the compile cache"}
    return [(os.path.abspath(d), what[kind]) for d, kind in search_places()]


def _kib(store_manifest: dict, ids) -> str:
    """The total, smallest and largest size of the modules `ids` as a store's manifest records them."""
    sizes = [store_manifest.get(i, {}).get("vmfb_bytes", 0) for i in ids]
    return f"{sum(sizes) / 1024:.0f} KiB (smallest {min(sizes) / 1024:.0f} KiB, largest {max(sizes) / 1024:.0f} KiB)"


_LIST_TARGETS = ["llvm-cpu", "vulkan-spirv", "cuda"]


def _targets_held(args) -> set:
    """The targets the stores `list` reports hold modules of (each manifest read once)."""
    from .compiler.build import ArtifactStore
    held = set()
    for d, _ in _list_stores(args):
        try:
            entries = ArtifactStore(d).manifest()["artifacts"]
        except OSError:
            continue
        held |= {e.get("target") for e in entries.values() if isinstance(e, dict)}
    return held


def _cmd_list(args) -> int:
    from .compiler.build import ArtifactStore
    from .compiler.targets import TARGETS
    from .runtime.store import cache_dir, search_order
    if args.target_cpu == "help":
        return _print_cpus()
    specs = _specs(args.op, args.dtype, args.kernel, args.form)
    # default: the CPU, Vulkan and CUDA, and any other target a store holds modules of
    names = args.target
    if not names:
        held = _targets_held(args)
        names = _LIST_TARGETS + [n for n in TARGETS if n not in _LIST_TARGETS and n in held]
    if not args.target and args.gpu_arch:  # one GPU's arch (sm_86, ampere): the GPU targets that know it
        from .compiler.targets import arch_problem, get_target

        def fits(name):
            try:
                return arch_problem(get_target(name, args.gpu_arch)) is None
            except ValueError:
                return False
        gpus = ("cuda", "vulkan-spirv") if args.gpu_arch.startswith("sm_") else ("vulkan-spirv", "cuda")
        names = ["llvm-cpu"] + ([n for n in ("vulkan-spirv", "cuda") if fits(n)] or list(gpus))  # none: say why
    targets = _targets(names, args.target_cpu, args.gpu_arch)
    stores = _list_stores(args)
    if args.dir and os.path.exists(stores[0][0]) and not os.path.isdir(stores[0][0]):
        raise UsageError(f"--dir {stores[0][0]} is not a directory")
    # a manifest path that is there at all (a FIFO, a directory or a dangling symlink in its place
    # too): its store is reported, unreadable, rather than taken for an empty one
    built = [(d, what, ArtifactStore(d)) for d, what in stores if os.path.lexists(os.path.join(d, "manifest.json"))]
    print(f"artifacts in {stores[0][0]}" if args.dir else search_order())
    if not built and not args.verbose:
        where = stores[0][0] if args.dir else " or ".join(d for d, _ in stores)
        print(f"nothing is built yet in {where}: run `aclnn-iree build` to compile every kernel for this CPU "
              f"(a few minutes on 2 cores, README 'Quick start'; --target vulkan-spirv / cuda for GPUs).  Until "
              f"then kernels compile on first use into the cache {cache_dir()}.")
        return 0
    manifests = {}
    for d, _, store in built:
        try:
            manifests[d] = store.manifest()["artifacts"]
        except OSError as e:
            if args.dir:
                raise CliError(f"cannot read {os.path.join(d, 'manifest.json')}: {e.strerror or e}") from None
            manifests[d] = {}  # its modules are reported unreadable below
    all_specs_ = specs
    for t in targets:
        groups = {"ok": [], "missing": [], "stale": [], "corrupt": [], "unreadable": []}
        in_store = {d: {k: [] for k in groups} for d, _ in stores}
        first = {}  # spec -> the store the runtime loads it from
        specs = list(dict.fromkeys(s for s in map(lambda s: s.for_target(t), all_specs_) if s is not None))
        for s in specs:
            states = [(d, store.status(s, t)) for d, _, store in built]
            for d, state in states:
                in_store[d][state].append(s)
            ok_in = [d for d, state in states if state == "ok"]
            if ok_in:
                first[s] = ok_in[0]
                groups["ok"].append(s)
            else:  # a damaged module anywhere says more than "missing"
                groups[next((state for _, state in states if state != "missing"), "missing")].append(s)
        ok = groups["ok"]
        # (the default Vulkan arch is a long feature string; a named profile is shown)
        arch = f" [{t.arch}]" if t.name in ("llvm-cpu", "cuda") or t.arch != TARGETS[t.name].arch else ""
        problems = [f"{len(groups[k])} {k}" for k in ("stale", "corrupt", "unreadable") if groups[k]]
        missing = len(specs) - len(ok)
        print(f"\n{t.name}{arch}: {len(ok)}/{len(specs)} built, {missing} missing"
              + (f" (of which {', '.join(problems)})" if problems else ""))
        if args.dir and ok:
            d = stores[0][0]
            print(f"  built: {len(ok)} module(s), "
                  + _kib(manifests[d], [ArtifactStore.artifact_id(s, t) for s in ok]))
        elif ok or problems:
            for d, what in stores:  # every store: a module in the cache and none in artifacts/ says so
                here = in_store[d]
                size = sum(manifests[d].get(ArtifactStore.artifact_id(s, t), {}).get("vmfb_bytes", 0)
                           for s in here["ok"])
                notes = [f"{size / 1024:.0f} KiB"] if here["ok"] else []
                notes += [f"{len(here[k])} {k}" for k in ("stale", "corrupt", "unreadable") if here[k]]
                notes += [] if os.path.isdir(d) else ["no such directory"]
                print(f"  {len(here['ok'])} in {what} {d}" + (f" ({', '.join(notes)})" if notes else ""))
        if args.verbose:
            where = {d: what for d, what in stores}
            for s in ok:
                print(f"    {s.kernel_name}" + ("" if args.dir else f"  ({where[first[s]]})"))
        if missing and not ok and not problems and not args.verbose:
            form = f" --form {args.form}" if args.form != "tuned" else ""
            print(f"  nothing built for this target (run `aclnn-iree build --target {t.name}{form}`; -v lists the names)")
            continue
        for kind in ("missing", "stale", "corrupt", "unreadable"):
            shown = groups[kind] if args.verbose or len(groups[kind]) <= _LIST_NAMES else groups[kind][:5]
            for s in shown:
                print(f"  {kind}: {s.kernel_name}")
            if len(shown) < len(groups[kind]):
                print(f"  ... and {len(groups[kind]) - len(shown)} more {kind} (-v lists them)")
    return 0


# `list` names up to this many modules of one kind (missing, stale, ...) without -v; more, the first 5
_LIST_NAMES = 12


def _cmd_demo(args) -> int:
    out = _writable_dir(args.out or "demo_output", "demo's output")
    _check_device(args.device)
    if args.photo:
        from .tools.demo import run_demo
        run_demo(out, quick=args.quick, device=args.device)
        return 0
    from .tools.stereo_demo import OPENMP_SPINCOUNT, check_output_files, limit_openmp_spin, run_stereo_demo
    check_output_files(out)  # before torch is imported and the job runs, not at the end
    openmp = limit_openmp_spin()  # before torch loads libgomp
    if openmp["set_by_demo"]:
        print(f"GOMP_SPINCOUNT={OPENMP_SPINCOUNT}: PyTorch's OpenMP workers stop spinning sooner, leaving the cores "
              "to IREE's between PyTorch's ops (set GOMP_SPINCOUNT or OMP_WAIT_POLICY to choose otherwise)")
    run_stereo_demo(out, quick=args.quick, backward=args.backward, device=args.device, openmp=openmp)
    return 0


# PyTorch crashes (SIGSEGV) on far more threads than this; no machine the bench runs on has more.
MAX_THREADS = 1024


def _roofline(args) -> int:
    from .ops.registry import OPERATORS
    if args.peers or args.device != "local-task" or args.op or args.json:
        raise CliError("--roofline measures the CPU kernels that have a roofline model on their own; --peers, "
                       "--device, --op and --json do not apply")
    for op in OPERATORS:
        if op.roofline is None:
            continue
        roofline = op.load("roofline")
        lack = roofline.missing()
        if lack:
            raise CliError(f"--roofline needs {lack}")
        try:
            roofline.run_roofline(args.threads, args.repeats, quick=args.quick)
        except RuntimeError as e:  # llvm-mca failed, or has no model of this CPU's instructions
            raise CliError(str(e)) from None
    return 0


def _cmd_bench(args) -> int:
    from .tools.bench import run_bench
    if args.json:
        args.json = _writable_file(args.json, "benchmark results")
    _check_device(args.device)
    if args.roofline:
        return _roofline(args)
    if "torch" in (args.op or []):
        if args.peers or args.device not in ("local-task", "cuda") or args.codegen:
            raise CliError("--op torch times training steps beside eager and torch.compile already, on the CPU "
                           "or with --device cuda on CUDA tensors; --peers, --codegen and other devices apply to "
                           "the kernel cases")
        from .tools.bench_torch import run_cuda_torch_bench, run_torch_bench
        if args.device == "cuda":
            try:
                result = run_cuda_torch_bench(quick=args.quick, repeats=args.repeats)
            except RuntimeError as e:
                raise CliError(str(e)) from None
        else:
            result = run_torch_bench(quick=args.quick, threads=args.threads, repeats=args.repeats)
        if args.json:
            import json
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0
    run_bench(quick=args.quick, threads=args.threads, device=args.device, ops=args.op or None,
              repeats=args.repeats, json_path=args.json, compile=not args.no_compile, peers=args.peers,
              codegen=args.codegen)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .compiler.specs import DTYPES
    from .ops.registry import OPERATORS
    op_names = [op.name for op in OPERATORS]
    from .compiler.targets import TARGETS

    p = _Parser(
        prog="aclnn-iree",
        description="aclnnGridSampler2D, aclnnUpsampleBilinear2d and their backward operators, compiled by IREE "
                    "for CPUs, Vulkan and CUDA.")
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print the versions of aclnn-iree, IREE's compiler and runtime, and PyTorch")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def selection(sp, target_default):
        sp.add_argument("--target", action="append", choices=list(TARGETS),
                        help=f"compile target (repeatable; default: {target_default})")
        sp.add_argument("--op", action="append", choices=op_names, help="operator (repeatable; default: all)")
        sp.add_argument("--dtype", action="append", choices=list(DTYPES), help="dtype (repeatable; default: all)")
        sp.add_argument("--form", choices=["tuned", "linalg", "all"], default="tuned",
                        help="kernel form: tuned (default: the hand-written kernels, or the linalg form on "
                             "targets without them), linalg (the linalg forms: IREE's own code generation), all")
        sp.add_argument("--kernel", action="append", metavar="GLOB",
                        help="only kernels whose name matches this shell pattern (repeatable), "
                             "e.g. '*bilinear_zeros*'")
        sp.add_argument("--target-cpu", metavar="CPU", type=_text("the CPU"),
                        help="llvm-cpu: the CPU to compile for (default 'host', this machine's CPU; name one, "
                             "e.g. x86-64-v3, for portable modules; the runtime uses the default target's "
                             "artifacts, so non-default ones are for embedding elsewhere; `help` lists the "
                             "CPUs iree-compile knows)")
        sp.add_argument("--gpu-arch", metavar="ARCH", type=_text("the GPU architecture"),
                        help="GPU targets: a named GPU architecture instead of the default "
                             "(vulkan-spirv: IREE's profiles, e.g. ampere, rdna3, valhall, whose dx uses the "
                             "ordered form (no float atomics in those profiles); cuda: e.g. sm_86; rocm: an AMD "
                             "gfx target, default gfx942, e.g. gfx1100; metal-spirv: macos (default) or ios); "
                             "built into <target>-<arch>/, for embedding elsewhere")

    b = sub.add_parser("build", help="compile every specialisation ahead of time (default target llvm-cpu)",
                       description="Render and compile every specialisation for the chosen targets.  "
                                   + _SEARCH_ORDER)
    selection(b, "llvm-cpu")
    b.add_argument("--jobs", "-j", type=_count(1, 1024), default=None, help="parallel compiles (default: CPU count)")
    b.add_argument("--out", metavar="DIR", type=_text("the directory"), help="artifact directory (default: the project's artifacts/ in a source "
                                                "checkout, else the per-user data directory)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.set_defaults(func=_cmd_build)

    ls = sub.add_parser("list", help="show what is built, for which targets, and what is missing",
                        description="Show which specialisations are built, in which store, for which "
                                    "targets, and which are missing, stale, corrupt or unreadable.  "
                                    + _SEARCH_ORDER)
    selection(ls, "all")
    ls.add_argument("--dir", metavar="DIR", type=_text("the directory"), help="only this artifact directory (default: every store the runtime "
                                                 "searches, in its order)")
    ls.add_argument("--verbose", "-v", action="store_true", help="list every kernel name")
    ls.set_defaults(func=_cmd_list)

    d = sub.add_parser("demo", help="dense stereo on the Middlebury Motorcycle pair through autograd, scored "
                                    "against its ground truth",
                       description="Estimates the disparity of a real stereo pair by gradient descent in PyTorch, "
                                   "with both operators (forward and backward) from our kernels, and scores it "
                                   "against the ground truth (see docs/getting-started.md).")
    d.add_argument("--out", metavar="DIR", type=_text("the directory"), help="output directory (default: demo_output/)")
    d.add_argument("--quick", action="store_true", help="quarter resolution, fewer steps (a few seconds)")
    d.add_argument("--kernels", "--backward", dest="backward", choices=["ours", "torch", "both"], default="ours",
                   help="whose grid_sample and interpolate kernels, forward and backward: ours (default), "
                        "PyTorch's, or both jobs side by side (--backward: the former name)")
    d.add_argument("--device", default="local-task", help="IREE device of our kernels (default local-task)")
    d.add_argument("--photo", action="store_true",
                   help="instead: the NumPy-only demo (image registration and a learned low-resolution image "
                        "on a photo), which needs no PyTorch")
    d.set_defaults(func=_cmd_demo)

    bn = sub.add_parser("bench", help="time our kernels beside PyTorch in one run and print the ratios",
                        description="Time every suite case through our kernels and beside PyTorch on the same "
                                    "data and thread count, in one run, and print the ratios (docs/performance.md).")
    bn.add_argument("--quick", action="store_true", help="a subset of the cases; float32 compile times only")
    bn.add_argument("--json", metavar="FILE", type=_text("the file name"), help="also write the results as JSON")
    bn.add_argument("--threads", type=_count(1, MAX_THREADS, f" (this machine has {os.cpu_count()} CPUs)"), default=2,
                    help="threads for us and for PyTorch (default 2)")
    bn.add_argument("--device", default="local-task", help="IREE device (default local-task)")
    bn.add_argument("--op", action="append", choices=op_names + ["torch"],
                    help="operator (repeatable; default: every operator); 'torch': training steps (forward + backward) "
                         "through aclnn_iree.torch beside PyTorch eager and torch.compile (on CUDA tensors with "
                         "--device cuda: ours through IREE's runtime and launched on PyTorch's stream)")
    bn.add_argument("--repeats", type=_count(1, 100000), default=10, help="timed runs per measurement (median; default 10)")
    bn.add_argument("--no-compile", action="store_true", help="skip the compile-time measurements")
    bn.add_argument("--peers", action="store_true",
                    help="also time torch.compile (inductor's compiled backward) and JAX (jit of linear_transpose "
                         "or vjp) where installed, with the ratio to the fastest peer of each case")
    bn.add_argument("--codegen", action="store_true",
                    help="also time the linalg form of each case (IREE's own code generation) and print what the "
                         "tuned kernels gain over it (x cg)")
    bn.add_argument("--roofline", action="store_true",
                    help="instead: the CPU grid sampler's cycles per output point beside its compute floor "
                         "(llvm-mca over the kernel's own assembly) and its memory floor")
    bn.set_defaults(func=_cmd_bench)
    return p


def versions() -> str:
    """aclnn-iree's version and those of IREE's compiler and runtime (and PyTorch, when installed)."""
    from importlib.metadata import PackageNotFoundError, version

    def v(dist):
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"
    from . import __version__
    return (f"aclnn-iree {__version__} (iree-base-compiler {v('iree-base-compiler')}, iree-base-runtime "
            f"{v('iree-base-runtime')}, torch {v('torch')})")


class _Version(argparse.Action):
    """--version: the versions, printed as they are (argparse's own action rewraps the line)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(versions())
        parser.exit()


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv=None) -> int:
    """Entry point of the `aclnn-iree` command; returns the exit status.

    A user's mistake or an unavailable resource prints one line, "error: ...", and
    returns 1, or 2 for a bad command line (UsageError; argparse's own raise SystemExit(2));
    a closed output pipe (`aclnn-iree list -v | head`) ends quietly.
    """
    args = build_parser().parse_args(argv)  # a bad command line: one line, SystemExit(2) (_Parser)
    from .core.errors import AclnnError
    from .runtime.device import DeviceUnavailable
    old = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        return args.func(args)
    except BrokenPipeError:
        # the reader went away: stop writing (Python would complain again at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ImportError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except UsageError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (CliError, AclnnError, DeviceUnavailable, OSError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = old


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
