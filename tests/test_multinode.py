"""Two nodes for real: two network namespaces joined by a veth pair, one ``sampan launch`` in each.

Each namespace has its own network stack (its own loopback, addresses and ports), so the two
launchers meet only over the veth link, through the c10d rendezvous at node A's address, as two
machines would. The 4-rank dp2 x mp2 run must match one process. Creating namespaces needs root
(CAP_SYS_ADMIN); where it is refused the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.network]

SCRIPT = Path(__file__).parent / "scripts" / "fleet_equivalence.py"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_nodes():
    """``[(namespace, interface, address), ...]`` for nodes A and B, removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed, so no network namespace can be made")
    tag = f"sp{os.getpid() % 100000}"
    nodes = [(f"{tag}a", f"{tag}va", "10.78.0.1"), (f"{tag}b", f"{tag}vb", "10.78.0.2")]
    made = _ip("netns", "add", nodes[0][0])
    if made.returncode != 0:
        pytest.skip(f"creating a network namespace was refused here ({made.stderr.strip()}); it needs root")
    try:
        for step in (["netns", "add", nodes[1][0]],
                     ["link", "add", nodes[0][1], "type", "veth", "peer", "name", nodes[1][1]]):
            result = _ip(*step)
            assert result.returncode == 0, result.stderr
        for namespace, interface, address in nodes:
            for step in (["link", "set", interface, "netns", namespace],
                         ["-n", namespace, "addr", "add", f"{address}/24", "dev", interface],
                         ["-n", namespace, "link", "set", interface, "up"],
                         ["-n", namespace, "link", "set", "lo", "up"]):
                result = _ip(*step)
                assert result.returncode == 0, result.stderr
        yield nodes
    finally:
        for namespace, _, _ in nodes:
            _ip("netns", "del", namespace)  # takes its end of the veth pair with it


@pytest.mark.timeout(400)
def test_two_node_launch_over_a_veth_link_matches_one_process(two_nodes, tmp_path):
    reference = tmp_path / "one.json"
    subprocess.run([sys.executable, str(SCRIPT), str(reference)], check=True, timeout=120, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    host = two_nodes[0][2]
    launchers = []
    for namespace, _, _ in reversed(two_nodes):  # the non-host first: it must wait for the host
        # Nothing is configured by hand: inside a namespace the hostname resolves to the outer
        # machine, so sampan launch must find the address (--local_addr) and the interface
        # (GLOO_SOCKET_IFNAME) that reach the rendezvous itself.
        env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        env["OMP_NUM_THREADS"] = "1"
        cmd = ["ip", "netns", "exec", namespace, sys.executable, "-m", "sampan.cli", "launch", "--nnodes", "2",
               "--nproc_per_node", "2", "--rdzv_endpoint", f"{host}:29400", "--rdzv_id", "two-nodes",
               str(SCRIPT), str(tmp_path / f"{namespace}.json"), "--dp", "2", "--mp", "2"]
        launchers.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outputs = []
    try:
        for launcher in launchers:
            outputs.append(launcher.communicate(timeout=300))
    finally:
        for launcher in launchers:
            launcher.kill()
    for launcher, (_, err), (_, interface, _) in zip(launchers, outputs, reversed(two_nodes), strict=True):
        assert launcher.returncode == 0, err[-3000:]
        assert f"using {interface}" in err  # the veth end, found from the route to the endpoint
    # Global rank 0 writes the losses; the c10d rendezvous decides which node holds it.
    written = [p for p in tmp_path.glob("*.json") if p != reference]
    assert len(written) == 1, written
    got = json.loads(written[0].read_text())["losses"]
    want = json.loads(reference.read_text())["losses"]
    assert len(got) == len(want) == 5
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert abs(g - w) <= 1e-5 * abs(w), f"step {step}: {g} vs one process {w}"
