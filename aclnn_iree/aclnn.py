"""The aclnn layer's public import path, `aclnn_iree.aclnn` (`from aclnn_iree import aclnn`,
`from aclnn_iree.aclnn import *`): the module itself lives in the core, aclnn_iree/core/aclnn.py.
This name is that same module object (monkeypatching either patches both)."""
import sys

from .core import aclnn as _aclnn

sys.modules[__name__] = _aclnn
