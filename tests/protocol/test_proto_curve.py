"""CURVE authentication with ZAP and key files: only clients whose public key is authorised get through."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from _proto_helpers import make_trajectory
from protocol.auth import CurveClient, CurveServer, generate_keypair
from protocol.rpc import RpcClient, RpcServer, RpcTimeout
from protocol.sandbox_jobs import SandboxJob, SandboxResult
from protocol.trajectory_channel import TrajectoryOutbox, TrajectoryReceiver
from protocol.weights_channel import WeightsFetcher, WeightsPublisher


@pytest.fixture
def keys(tmp_path):
    server_pub, server_sec = generate_keypair(tmp_path / "server", "server")
    good_pub, good_sec = generate_keypair(tmp_path / "good", "good")
    _, bad_sec = generate_keypair(tmp_path / "bad", "bad")
    allowed = tmp_path / "authorized"
    allowed.mkdir()
    (allowed / "good.key").write_bytes(good_pub.read_bytes())
    return {
        "server": CurveServer(secret_key_file=server_sec, authorized_keys_dir=allowed),
        "good": CurveClient(secret_key_file=good_sec, server_public_key_file=server_pub),
        "bad": CurveClient(secret_key_file=bad_sec, server_public_key_file=server_pub),
    }


def job(i):
    return SandboxJob(job_id=f"job-{i}", task={"id": "t"}, files={}, format="cpu")


def test_rpc_with_curve_refuses_unknown_clients(keys):
    handler = lambda req: SandboxResult(req.message.job_id, "ok", {}, "A")  # noqa: E731
    with RpcServer("tcp://127.0.0.1:*", handler, expect=(SandboxJob,), server_id="A", curve=keys["server"]).start() as srv:
        with RpcClient([srv.endpoint], expect=(SandboxResult,), curve=keys["good"], heartbeat_s=0.1) as good:
            assert good.call(job(1), timeout_s=5).status == "ok"
        with RpcClient([srv.endpoint], expect=(SandboxResult,), curve=keys["bad"], heartbeat_s=0.1) as bad:
            with pytest.raises(RpcTimeout):
                bad.call(job(2), timeout_s=0.5, attempts=2)
            assert not bad.wait_connected(0.2)
        with RpcClient([srv.endpoint], expect=(SandboxResult,), heartbeat_s=0.1) as plain:  # no CURVE at all
            with pytest.raises(RpcTimeout):
                plain.call(job(3), timeout_s=0.5, attempts=1)
        assert srv.stats["requests"] == 1 and srv.stats["bad_messages"] == 0


def test_trajectories_and_weights_with_curve(keys, tmp_path):
    with TrajectoryReceiver("tcp://127.0.0.1:*", tmp_path / "spool", curve=keys["server"]).start() as rx:
        with TrajectoryOutbox(rx.endpoint, actor_id="good", curve=keys["good"]) as ob:
            ob.put(make_trajectory(1))
            assert ob.flush(timeout_s=10)
        with TrajectoryOutbox(rx.endpoint, actor_id="bad", curve=keys["bad"], resend_after_s=0.1) as ob:
            ob.put(make_trajectory(2))
            assert not ob.flush(timeout_s=1.0)
        assert rx.stats["received"] == 1 and "ep-000002" not in rx.spool

    with WeightsPublisher("tcp://127.0.0.1:*", curve=keys["server"]).start() as pub:
        pub.publish(1, {"w": np.arange(10, dtype=np.float32)})
        with WeightsFetcher(pub.endpoint, curve=keys["good"], timeout_s=5) as f:
            assert f.fetch().version == 1
        with WeightsFetcher(pub.endpoint, curve=keys["bad"], timeout_s=0.5) as f:
            with pytest.raises(TimeoutError):
                f.fetch()
        assert pub.stats["manifests_sent"] == 1


def test_keys_are_checked_when_configured(tmp_path):
    with pytest.raises(FileNotFoundError, match="secret_key_file"):
        CurveServer(secret_key_file=tmp_path / "nope", authorized_keys_dir=tmp_path)
    assert zmq.has("curve")
