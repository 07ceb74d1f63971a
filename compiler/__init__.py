"""Specialisation -> rendered MLIR -> vmfb (IREE), for each target device."""
from .specs import (DTYPES, GridSamplerSpec, UpsampleSpec, all_specs, dtype_info)  # noqa: F401
from .render import render  # noqa: F401
from .compile import CompileError, CompilerMissing, compile_file, compiler_available, compiler_version  # noqa: F401
from .targets import TARGETS, Target, get_target, target_for_driver  # noqa: F401
