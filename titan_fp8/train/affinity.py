"""[comm] cpu_affinity = "gpu_numa_node": run each rank's threads on the CPUs of its GPU's NUMA node.

A float8 step of llama_moe on 2 H200s is host-bound part of the time, and in session 10 the same Python ran 25-40%
slower in some steps than in others (benchmarks/results/llama_moe_e2e_x2_s10/NOTE.md), with the rank processes
placed by the OS. Binding keeps a rank near its GPU and its memory. torchrun's own `--numa-binding` needs the
`numactl` program, which the GPU image lacks; this reads the same facts from sysfs and calls sched_setaffinity.
Called before any thread of ours exists (threads made later inherit the set). Linux only.
"""
from __future__ import annotations

import os

SYSFS = "/sys"


class AffinityError(RuntimeError):
    """[comm] cpu_affinity cannot be applied on this machine (what is missing is named)."""


def parse_cpulist(text: str) -> set[int]:
    """sysfs's CPU list ("0-15,32-47", "3", "") -> the set of CPU indices."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            cpus.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise AffinityError(f"cpu_affinity: cannot read the CPU list {text.strip()!r}") from None
    return cpus


def numa_node_cpus(pci_address: str, sysfs: str = SYSFS) -> tuple[int, set[int]]:
    """(NUMA node, its CPUs) of the PCI device at `pci_address` ("0000:18:00.0")."""
    node_file = os.path.join(sysfs, "bus", "pci", "devices", pci_address.lower(), "numa_node")
    try:
        with open(node_file) as f:
            node = int(f.read().strip())
    except (OSError, ValueError) as e:
        raise AffinityError(f"[comm] cpu_affinity = 'gpu_numa_node': cannot read the GPU's NUMA node from "
                            f"{node_file} ({e})") from None
    node = max(node, 0)  # -1: a machine with one NUMA node (sysfs gives no node), which is node 0
    cpu_file = os.path.join(sysfs, "devices", "system", "node", f"node{node}", "cpulist")
    try:
        with open(cpu_file) as f:
            return node, parse_cpulist(f.read())
    except OSError as e:
        raise AffinityError(f"[comm] cpu_affinity = 'gpu_numa_node': cannot read {cpu_file} ({e})") from None


def gpu_pci_address(device_index: int) -> str:
    import torch

    props = torch.cuda.get_device_properties(device_index)
    parts = [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if any(p is None for p in parts):
        raise AffinityError("[comm] cpu_affinity = 'gpu_numa_node': this torch does not report the GPU's PCI "
                            "address (torch.cuda.get_device_properties(...).pci_bus_id)")
    domain, bus, dev = parts
    return f"{domain:04x}:{bus:02x}:{dev:02x}.0"


def bind_to_gpu_numa_node(device_index: int, sysfs: str = SYSFS, pci_address: str | None = None) -> str:
    """Restrict this process to the CPUs of GPU `device_index`'s NUMA node that it may use now; one log line."""
    address = pci_address or gpu_pci_address(device_index)
    node, cpus = numa_node_cpus(address, sysfs)
    allowed = os.sched_getaffinity(0)
    use = cpus & allowed
    if not use:
        raise AffinityError(f"[comm] cpu_affinity = 'gpu_numa_node': NUMA node {node} of GPU {device_index} "
                            f"({address}) has CPUs {sorted(cpus)[:8]}..., none of which this process may use")
    os.sched_setaffinity(0, use)
    return (f"cpu affinity: GPU {device_index} ({address}) is on NUMA node {node}; this rank runs on its "
            f"{len(use)} of {len(allowed)} allowed CPUs")
