"""The core: the aclnn layer (aclnn.py: two-phase calls, streams, executors), its tensors
(tensors.py), argument validation (validation.py), statuses and errors (errors.py), the
Pythonic layer over it (api.py), and how the package was installed (install.py, for
messages that name the install command).  Operators plug in through aclnn_iree.ops."""
