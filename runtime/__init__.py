"""Loads compiled modules on IREE devices and runs their exported functions."""
from .device import Device, DeviceUnavailable, get_device  # noqa: F401
from .kernels import Kernel, LoadedModule, load_module  # noqa: F401
from .store import ArtifactMissing, set_artifacts_dir, set_offline  # noqa: F401
