"""Two real hosts, simulated: two network namespaces joined by a veth pair (root only; `nox -s hosts`).

Each namespace is a host as users meet them: its hostname resolves to 127.0.1.1 (Ubuntu's /etc/hosts
entry, through /etc/netns/<name>/hosts), and a decoy link on another subnet, with no way to the other
host, was created before the real one. Node 0 is 10.77.0.1, node 1 is 10.77.0.2. The rendered
linux-torchrun project trains across them on the spawn path and under torchrun, and the results are
bitwise equal to two ranks on one machine. Marked `hosts`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from trained import assert_bitwise_equal, package_of, train_on_one_machine

pytestmark = [pytest.mark.hosts, pytest.mark.xdist_group("hosts")]  # one worker: its reference trains once

NODE_ADDRESSES = ("10.77.0.1", "10.77.0.2")
TIMEOUT_S = 15
SETTINGS = ("--device", "cpu", "--backend", "gloo", "--precision", "no", "--parallelism", "ddp", "--epochs", "2",
            "--samples", "512", "--global-batch-size", "32", "--seed", "5", "--no-progress")  # fmt: skip


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Hosts:
    namespaces: tuple[str, str]
    links: tuple[str, str]  # the real link's name inside each namespace

    def run(self, node: int, command: list[str], env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[node], *command], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


@pytest.fixture
def hosts():
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs Linux, root and iproute2: network namespaces and veth pairs stand in for two hosts")
    tag = secrets.token_hex(2)
    namespaces = (f"ddp{tag}n0", f"ddp{tag}n1")
    links = (f"ddp{tag}r0", f"ddp{tag}r1")
    hostname = socket.gethostname()
    try:
        for node, namespace in enumerate(namespaces):
            ip("netns", "add", namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
            hosts_file = Path("/etc/netns") / namespace / "hosts"
            hosts_file.parent.mkdir(parents=True, exist_ok=True)
            hosts_file.write_text(f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n", encoding="utf-8")
            # The decoy: up, addressed, first in the list, and leading nowhere (its peer stays outside).
            decoy = f"ddp{tag}d{node}"
            ip("link", "add", decoy, "type", "veth", "peer", "name", f"ddp{tag}x{node}")
            ip("link", "set", decoy, "netns", namespace)
            ip("-n", namespace, "addr", "add", f"10.99.{node}.1/24", "dev", decoy)
            ip("-n", namespace, "link", "set", decoy, "up")
        ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for node, namespace in enumerate(namespaces):
            ip("link", "set", links[node], "netns", namespace)
            ip("-n", namespace, "addr", "add", f"{NODE_ADDRESSES[node]}/24", "dev", links[node])
            ip("-n", namespace, "link", "set", links[node], "up")
        yield Hosts(namespaces, links)
    finally:
        for namespace in namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
        for node in range(2):
            subprocess.run(["ip", "link", "del", f"ddp{tag}x{node}"], capture_output=True)


@pytest.fixture(scope="session")  # session: xdist interleaves modules
def project(rendered):
    return rendered("linux-torchrun")


def environment(project: Path, **extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(project / "src"), **extra}


def both_nodes(hosts: Hosts, commands: list[list[str]], env: dict, limit_s: float) -> list[tuple[int, str, float]]:
    """Start both nodes at once; return (exit status, output, seconds) of each, killing what outlives limit_s."""
    started = time.monotonic()
    jobs = [hosts.run(node, command, env) for node, command in enumerate(commands)]
    results = []
    for job in jobs:
        try:
            out, err = job.communicate(timeout=max(1.0, limit_s - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
            results.append((None, out + err, time.monotonic() - started))
            continue
        results.append((job.returncode, out + err, time.monotonic() - started))
    return results


def spawn_node(project: Path, output: Path, node: int, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", f"{package_of(project)}.train", "--config", str(project / "configs" / "train.toml"),
            *SETTINGS, "--output-dir", str(output), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
            "1", "--master-addr", NODE_ADDRESSES[0], "--master-port", str(port), "--timeout-s", str(TIMEOUT_S),
            *extra]  # fmt: skip


@pytest.fixture(scope="session")  # session: xdist interleaves modules
def one_machine(project, tmp_path_factory) -> Path:
    """The same training as 2 ranks on one machine: what both hosts together must reproduce."""
    return train_on_one_machine(project, tmp_path_factory.mktemp("one-machine"), *SETTINGS)


def test_the_spawn_path_across_two_hosts_picks_the_routed_address_and_matches_one_machine(
    hosts, project, one_machine, tmp_path
):
    output = tmp_path / "shared"  # one folder for both: only the first rank writes, each rank its own log
    commands = [spawn_node(project, output, node, 29611) for node in range(2)]
    results = both_nodes(hosts, commands, environment(project), limit_s=240)
    for status, text, _ in results:
        assert status == 0, text
    for rank, address in enumerate(NODE_ADDRESSES):
        log = (output / "logs" / f"rank{rank}.log").read_text(encoding="utf-8")
        assert f"gloo listens on {address}: the local address that routes to master_addr 10.77.0.1" in log
    assert_bitwise_equal(one_machine, output)


def test_torchrun_across_two_hosts_hosts_the_store_on_node_0_and_matches_one_machine(
    hosts, project, one_machine, tmp_path
):
    output = tmp_path / "shared"
    script = str(project / "scripts" / "train.sh")
    commands = [["bash", script, *SETTINGS, "--output-dir", str(output), "--nnodes", "2", "--node-rank", str(node),
                 "--nproc-per-node", "1", "--master-addr", NODE_ADDRESSES[0], "--master-port", "29613",
                 "--timeout-s", "60"] for node in range(2)]  # fmt: skip
    results = both_nodes(hosts, commands, environment(project, RDZV_ID=tmp_path.name), limit_s=240)
    for status, text, _ in results:
        assert status == 0, text
    assert_bitwise_equal(one_machine, output)


def test_an_unreachable_master_ends_every_node_in_time_naming_the_address(hosts, project, tmp_path):
    ip("-n", hosts.namespaces[1], "link", "set", hosts.links[1], "down")  # node 1 has no way to node 0
    commands = [spawn_node(project, tmp_path / f"node{node}", node, 29615) for node in range(2)]
    results = both_nodes(hosts, commands, environment(project), limit_s=TIMEOUT_S + 60)
    for node, (status, text, seconds) in enumerate(results):
        assert status not in (0, None), f"node {node} did not fail: {text}"
        # The time includes each node's start (its spawned rank imports torch: 15-20 s on 2 busy cores); a node
        # that waited past timeout_s would take minutes, not seconds.
        assert seconds < TIMEOUT_S + 30, f"node {node} took {seconds:.0f}s"
        assert "10.77.0.1" in text, text
    assert "no route from this machine to master_addr 10.77.0.1" in results[1][1]
    assert f"did not all meet at 10.77.0.1:29615 within {TIMEOUT_S}s" in results[0][1]
    assert "gloo listened on 10.77.0.1" in results[0][1]


def test_gloo_socket_ifname_set_by_hand_still_wins(hosts, project, one_machine, tmp_path):
    output = tmp_path / "shared"
    commands = [spawn_node(project, output, node, 29617) for node in range(2)]
    started = time.monotonic()
    jobs = [hosts.run(node, command, environment(project, GLOO_SOCKET_IFNAME=hosts.links[node]))
            for node, command in enumerate(commands)]  # fmt: skip
    for job in jobs:
        out, err = job.communicate(timeout=max(1.0, 240 - (time.monotonic() - started)))
        assert job.returncode == 0, out + err
    for rank in range(2):
        log = (output / "logs" / f"rank{rank}.log").read_text(encoding="utf-8")
        assert f"gloo listens on interface {hosts.links[rank]} (GLOO_SOCKET_IFNAME)" in log
    assert_bitwise_equal(one_machine, output)
