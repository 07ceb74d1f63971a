"""What every operator's PyTorch module shares: the `aclnn_iree` op library (torch.library),
the kernel registration, dtype checks, and the call of a backward op from an autograd formula."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _bridge as B

__all__ = ["op", "check_dtype", "masked", "below_autograd", "autograd_function", "check_bool"]

_lib = torch.library.Library("aclnn_iree", "DEF")


def op(schema: str):
    """Decorator: defines `aclnn_iree::<schema>` (aten's own schemas) and registers the
    function as its Python kernel for every backend (Library.impl: about 5 us per call, a
    quarter of torch.library.custom_op's wrapper); each kernel picks its device itself."""
    def register(fn):
        _lib.define(schema)
        _lib.impl(schema.split("(", 1)[0], fn, "CompositeExplicitAutograd")
        return fn
    return register


def check_dtype(op, *tensors):
    for t in tensors:
        if t.dtype not in B.SUPPORTED_DTYPES:
            raise ValueError(f"aclnn_iree.{op}: dtype {t.dtype} is not supported; supported: "
                             + ", ".join(str(d) for d in B.SUPPORTED_DTYPES))


def masked(t: Optional[Tensor], like: Tensor) -> Tensor:
    return t if t is not None else like.new_empty(0)


_PLAIN_DISPATCH = Tensor.__torch_dispatch__


def _direct(args) -> bool:
    """Whether a call with arguments `args` may go straight to an op's Python kernel, as its
    dispatcher would: in eager mode, with no dispatch mode active (FakeTensorMode,
    FlopCounterMode and the like see the op instead) and no tensor of a subclass with its own
    __torch_dispatch__ (a wrapper such as TwoTensor, whose own memory is none: the
    dispatcher hands the op to the subclass); while dynamo traces, the op (a custom op call in
    its graph)."""
    # is_compiling() first: dynamo folds it, and cannot trace the dispatch-stack query
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    for a in args:
        if type(a) is not Tensor and isinstance(a, Tensor) and type(a).__torch_dispatch__ is not _PLAIN_DISPATCH:
            return False
    return True


def below_autograd(op, kernel, *args):
    """Calls one of our ops from an autograd formula or an autograd.Function's forward.  With
    grad mode on (create_graph=True) through the op's autograd wrapper, so that the double
    backward formula is recorded; else (a first-order backward) its Python `kernel` itself
    where _direct() allows (what the dispatcher would call below the Autograd key: the op's
    wrapper would only pass the call on, for ~20 us of dispatch and Python here; tiny
    grid_sample backward 81 -> 50 us), otherwise the op below the Autograd key.  While dynamo
    traces, the op (its graph is differentiated by AOTAutograd, not by this call)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():  # dynamo cannot trace the guard below
        return op(*args)
    if _direct(args):
        return kernel(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


# The functions' autograd: an autograd.Function around our forward op whose setup and backward
# are the formulas registered for the forward ops (each operator module's _setup / _backward),
# so the same gradients through the same backward ops.  Outside the op rather than through it: the
# op's register_autograd kernel costs ~65 us a call here, most of it torch._library's
# fill_defaults (quadratic in the schema's arity, pytorch/pytorch#195110), against ~15 us for
# an autograd.Function whose forward takes ctx (one with a separate setup_context binds its
# arguments with inspect.signature on every call, another ~60 us); torch.compile traces either,
# and the compiled backward graph holds our backward ops all the same (tests/test_torch.py).
def autograd_function(name, forward_op, kernel, setup_context, backward):
    """An autograd.Function: our forward op `forward_op`, then the op's setup_context.  Where
    _direct() allows, the op's Python `kernel` itself (what its dispatcher would call: ~8 us
    less a call), else the op."""
    def forward(ctx, *inputs):
        output = kernel(*inputs) if _direct(inputs) else forward_op(*inputs)
        setup_context(ctx, inputs, output)
        return output
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})


def check_bool(fn: str, align_corners):
    """align_corners must be a bool, as PyTorch's bindings insist (TypeError, not a truthiness)."""
    if not isinstance(align_corners, bool):
        raise TypeError(f"{fn}(): argument 'align_corners' must be bool, not {type(align_corners).__name__}")
