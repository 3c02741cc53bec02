"""The Llama-3-8B-shaped block of the FSDP float8 anchor (`shared/anchors/fsdp_fp8_probe.py`): the five linears
of a Llama block (wq, wo stand in for attention, whose core is left out) and two RMSNorms. Benchmarks and the
float8 memory tests build the same block, so their numbers compare."""
import torch.nn as nn
import torch.nn.functional as F


class ProbeBlock(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.n1 = nn.RMSNorm(dim)
        self.n2 = nn.RMSNorm(dim)

    def forward(self, x):
        x = x + self.wo(F.silu(self.wq(self.n1(x))))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))
