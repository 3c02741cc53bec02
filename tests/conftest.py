import os
import sys

import torch

# Triton kernels run in the interpreter where there is no GPU. The flag must be set
# before any module decorates a kernel with @triton.jit.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
