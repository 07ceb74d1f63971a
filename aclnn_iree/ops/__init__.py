"""One module per operator: what the package knows of an operator, in one place.

Each operator module owns
- its aclnn name (ACLNN_NAME) and vocabulary: the aclnn/PyTorch integer codes of its
  modes and the names that the kernel names and templates use;
- `check(...)`: its argument checks, in aclnn's order (statuses and messages);
- `bind(...)`: the checked arguments bound to a compiled function: the specialisation
  (a compiler/specs.py dataclass, which maps it to its kernel name and template), the
  exported function's name and the tensors it takes, in order.
The aclnn layer (aclnn.py) runs what an operator binds; the Pythonic layer (api.py)
translates PyTorch's names and goes through the aclnn layer.  Adding an operator means
adding a module here, a spec in compiler/specs.py and a template family (CONTRIBUTING.md).
"""
from __future__ import annotations

import dataclasses

__all__ = ["Binding"]


@dataclasses.dataclass(frozen=True)
class Binding:
    """What phase 1 decided for one call.

    spec: the specialisation to run, or None when there is nothing to compute;
    function: the name of the exported function; tensors: the aclTensors it takes, in
    its argument order (inputs, then outputs); zero_fill: outputs that are all zeros
    without a kernel (empty inputs: nothing contributes).
    """

    spec: object = None
    function: str = ""
    tensors: tuple = ()
    zero_fill: tuple = ()
