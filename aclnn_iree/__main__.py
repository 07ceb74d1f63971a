"""`python -m aclnn_iree ...`: the same as the `aclnn-iree` command."""
import sys

from .cli import main

sys.exit(main())
