"""How this package was installed, for messages that name the right install command."""
from __future__ import annotations

import functools
import json

__all__ = ["is_editable", "install_command"]


@functools.lru_cache(maxsize=None)
def is_editable() -> bool:
    """Whether aclnn-iree is an editable install (pip install -e) of a source checkout."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        text = distribution("aclnn-iree").read_text("direct_url.json")
    except PackageNotFoundError:
        return False
    try:
        return bool(json.loads(text or "{}").get("dir_info", {}).get("editable"))
    except ValueError:
        return False


def install_command(extra: str) -> str:
    """The pip command that adds `extra` ("test", "demo", "torch") to this installation."""
    return f"pip install -e '.[{extra}]'" if is_editable() else f"pip install 'aclnn-iree[{extra}]'"
