"""Two nodes as two hosts: each in its own network namespace (`ip netns`), reached over a veth pair from the
test's namespace. Binding beyond loopback turns CURVE on: the client with the authorised key gets results from
both nodes; a client without keys gets nothing through."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from sandbox.client import SandboxClient, SandboxClientError
from protocol.auth import init_keys
from sandbox.stress import LocalNode

from _svc_helpers import NODE, corpus, job

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 (`apt-get install -y iproute2`)")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    tag = uuid.uuid4().hex[:6]
    hosts = []
    try:
        for i, name in enumerate(("a", "b"), start=1):
            ns, veth, peer = f"ca-{name}-{tag}", f"ca{tag}{name}0", f"ca{tag}{name}1"
            subnet = f"10.213.{(int(tag, 16) % 100) * 2 + i}"
            _ip("netns", "add", ns)
            hosts.append({"ns": ns, "veth": veth})
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("addr", "add", f"{subnet}.1/24", "dev", veth)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{subnet}.2/24", "dev", peer)
            _ip("-n", ns, "link", "set", peer, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts[-1]["addr"] = f"{subnet}.2"
        yield hosts
    finally:
        for h in hosts:
            subprocess.run(["ip", "link", "del", h["veth"]], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", h["ns"]], capture_output=True, timeout=30)


@pytest.mark.slow
def test_two_nodes_in_separate_network_namespaces_with_curve(tmp_path, two_hosts):
    keys = init_keys(tmp_path / "keys")
    nodes = []
    try:
        for h, name in zip(two_hosts, ("node-a", "node-b")):
            nodes.append(LocalNode([*NODE, f"endpoint=tcp://{h['addr']}:5557", f"node_id={name}",
                                    f"curve_secret_key={keys['server_secret_key']}",
                                    f"curve_authorized_keys={keys['authorized_keys']}"],
                                   log_path=tmp_path / f"{name}.log", netns=h["ns"], wait=False))
        for n in nodes:
            n.wait_ready()
            assert n.info["curve"] is True
        eps = [f"tcp://{h['addr']}:5557" for h in two_hosts]
        sols = corpus()
        with SandboxClient(eps, curve_secret_key=keys["client_client_secret_key"],
                           server_public_key=keys["server_public_key"]) as c:
            assert c.wait_for_nodes(timeout_s=60)
            futs = [c.submit(job(sols[k], salt=uuid.uuid4().hex)) for k in ("fast", "wrong")]
            results = [f.result(timeout=300) for f in futs]
        assert [r.status for r in results] == ["ok", "incorrect"]
        assert {r.node_id for r in results} == {"node-a", "node-b"}  # one job per node: spread by free capacity
        # no keys: the CURVE handshake fails, no job gets through, and the caller still gets an answer in time
        with SandboxClient(eps[:1], attempts=1) as plain:
            with pytest.raises(SandboxClientError) as e:
                plain.run(job(sols["fast"], salt=uuid.uuid4().hex, deadline_s=3.0))
            assert e.value.code == "timeout"
            assert plain.nodes()[eps[0]]["status"] == {}
    finally:
        for n in nodes:
            n.stop()
