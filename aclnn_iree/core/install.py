"""How this package was installed, for messages that name the right install command."""
from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["source_checkout", "install_command"]


@functools.lru_cache(maxsize=None)
def source_checkout():
    """The root of the source checkout the package runs from (an editable install, or the
    repository on sys.path), or None for an installed package: a pyproject.toml naming
    aclnn-iree beside the package's directories."""
    root = Path(__file__).resolve().parent.parent.parent  # aclnn_iree/core/install.py -> the checkout
    try:
        if 'name = "aclnn-iree"' in (root / "pyproject.toml").read_text():
            return root
    except OSError:
        pass
    return None


def install_command(extra: str) -> str:
    """The pip command that adds `extra` ("test", "demo", "torch", "bench") to this installation."""
    return f"pip install -e '.[{extra}]'" if source_checkout() else f"pip install 'aclnn-iree[{extra}]'"
