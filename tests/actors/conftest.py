"""Fixtures of the actor tests: a tokenizer trained on the skill text, and one sandbox node on the CPU backend
(in this process, its workers real processes) shared by the tests of the session.

The node's settings keep evaluations short on 2 cores: two verification trials, five timing repetitions, and
no torch.compile baseline (its first call costs 15-18 s here), so rewards top out at 1 (faster than eager).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _helpers import make_tokenizer  # noqa: E402


def node_sandbox_config(tmp: Path):
    from sandbox.config import SandboxConfig

    return SandboxConfig(backend="cpu", use_compile=False, reps=5, num_trials=2, min_rep_ms=1.0,
                         bootstrap_samples=500, cache_dir=str(tmp / "cache"), work_root=str(tmp / "work"))


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def sandbox_node(tmp_path_factory):
    from sandbox.service import SandboxNode, ServiceConfig

    tmp = tmp_path_factory.mktemp("sandbox-node")
    node = SandboxNode(ServiceConfig(endpoint="tcp://127.0.0.1:0", node_id="test-node", workers=1, build_workers=1,
                                     metrics_port=-1, sandbox=node_sandbox_config(tmp))).start()
    assert node.wait_ready(180), "sandbox node workers did not come up"
    yield node
    node.drain(10)
    node.close()


@pytest.fixture()
def sandbox_client(sandbox_node):
    from sandbox.client import SandboxClient

    with SandboxClient([sandbox_node.endpoint], client_id="actor-test", heartbeat_s=0.5) as client:
        yield client
