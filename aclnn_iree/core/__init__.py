"""The core: the aclnn layer (aclnn.py: two-phase calls, streams, executors), its tensors
(tensors.py), argument validation (validation.py), statuses and errors (errors.py), and the
Pythonic layer over it (api.py).  Operators plug in through aclnn_iree.ops."""
