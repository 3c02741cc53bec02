"""[comm] cpu_affinity: the GPU's NUMA node and its CPUs read from a sysfs tree (a fake one here), the binding
itself on this process, and the clear errors (unknown node, no usable CPU, no GPU, a bad value)."""
import os
import subprocess
import sys

import pytest

from titan_fp8.train.affinity import AffinityError, bind_to_gpu_numa_node, numa_node_cpus, parse_cpulist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADDR = "0000:18:00.0"


def fake_sysfs(tmp_path, node: str, cpulists: dict) -> str:
    dev = tmp_path / "bus" / "pci" / "devices" / ADDR
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(node + "\n")
    for n, text in cpulists.items():
        d = tmp_path / "devices" / "system" / "node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(text + "\n")
    return str(tmp_path)


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == set()
    with pytest.raises(AffinityError, match="CPU list"):
        parse_cpulist("0-x")


def test_numa_node_cpus_from_sysfs(tmp_path):
    root = fake_sysfs(tmp_path, "1", {0: "0-15", 1: "16-31,48-63"})
    node, cpus = numa_node_cpus(ADDR.upper(), root)
    assert node == 1 and cpus == set(range(16, 32)) | set(range(48, 64))
    with pytest.raises(AffinityError, match="cannot read the GPU's NUMA node"):
        numa_node_cpus("0000:99:00.0", root)


def test_no_numa_node_means_the_one_node(tmp_path):
    root = fake_sysfs(tmp_path, "-1", {0: "0-7"})  # a one-node machine: sysfs says -1
    assert numa_node_cpus(ADDR, root) == (0, set(range(8)))


def test_binds_this_process_to_the_nodes_allowed_cpus(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    keep = set(allowed[:1])
    root = fake_sysfs(tmp_path, "0", {0: ",".join(map(str, sorted(keep | {10_000})))})  # 10000: not allowed here
    try:
        line = bind_to_gpu_numa_node(0, sysfs=root, pci_address=ADDR)
        assert os.sched_getaffinity(0) == keep and "NUMA node 0" in line and f"its {len(keep)} of" in line
    finally:
        os.sched_setaffinity(0, allowed)
    root2 = fake_sysfs(tmp_path / "b", "0", {0: "10000-10001"})
    with pytest.raises(AffinityError, match="none of which this process may use"):
        bind_to_gpu_numa_node(0, sysfs=root2, pci_address=ADDR)
    assert sorted(os.sched_getaffinity(0)) == allowed


def test_config_value_and_no_gpu_errors():
    from titan_fp8.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="cpu_affinity.*allowed: 'none', 'gpu_numa_node'"):
        load_config("train_configs/debug_moe.toml", ["--comm.cpu_affinity=numa"], world_size=1)
    proc = subprocess.run([sys.executable, "launch/train.py", "--config", "train_configs/debug_moe.toml",
                           "--comm.cpu_affinity=gpu_numa_node", "--training.steps=1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cpu_affinity = 'gpu_numa_node'" in proc.stderr and "no GPU here" in proc.stderr
