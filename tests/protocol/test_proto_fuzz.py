"""Garbage, truncated, oversized and wrong messages at every service socket: each is refused (ProtocolError,
counted) and the service keeps answering."""

from __future__ import annotations

import random
import time

import msgpack
import numpy as np
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from _proto_helpers import make_trajectory
from protocol.codec import PROTOCOL_VERSION, Limits, decode, encode
from protocol.errors import ProtocolError
from protocol.handshake import Error, Hello
from protocol.rpc import RpcClient, RpcServer
from protocol.sandbox_jobs import SandboxJob, SandboxResult
from protocol.sockets import recv_frames
from protocol.trajectory import TrajectoryAck
from protocol.trajectory_channel import TrajectoryOutbox, TrajectoryReceiver
from protocol.weights import WeightsChunk, WeightsChunkRequest
from protocol.weights_channel import WeightsFetcher, WeightsPublisher

from _proto_helpers import all_message_types

ALL_TYPES = all_message_types()


# ---------------------------------------------------------------------------------------------------------
# the decoder never raises anything but ProtocolError
@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=0, max_size=8))
def test_decode_of_random_frames_only_raises_protocol_error(frames):
    try:
        decode(frames, ALL_TYPES, Limits(max_array_bytes=1 << 20))
    except ProtocolError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_decode_of_mutated_valid_messages_only_raises_protocol_error(data):
    msg = data.draw(st.sampled_from([
        make_trajectory(1, num_tokens=9), SandboxJob("j", {"id": "t"}, {"a.cu": "x"}, "cpu"),
        WeightsChunk(version=1, index=2, data=np.arange(10, dtype=np.uint8)), Hello(role="actor", id="a"),
    ]))
    frames = [bytearray(f) for f in encode(msg)]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frames) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "grow", "drop", "dup"]))
        f = frames[i]
        if action == "flip" and f:
            f[data.draw(st.integers(0, len(f) - 1))] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del f[data.draw(st.integers(0, len(f))):]
        elif action == "grow":
            f += data.draw(st.binary(min_size=1, max_size=16))
        elif action == "drop" and len(frames) > 1:
            frames.pop(i)
        elif action == "dup":
            frames.insert(i, bytearray(f))
    try:
        decode([bytes(f) for f in frames], ALL_TYPES)
    except ProtocolError:
        pass


# ---------------------------------------------------------------------------------------------------------
# services under garbage
def _bad_payloads(valid: list[bytes], rng: random.Random) -> list[list[bytes]]:
    """Bad messages built from one valid message's frames."""
    head = valid[0]
    out = [[rng.randbytes(rng.randint(0, 200))] for _ in range(30)]                     # garbage
    out += [[rng.randbytes(rng.randint(1, 50)) for _ in range(rng.randint(2, 5))] for _ in range(10)]
    out += [[head[:rng.randint(0, len(head) - 1)], *valid[1:]] for _ in range(10)]      # truncated header
    if len(valid) > 1:
        out += [valid[:-1], valid + [b"extra"], [head, valid[1][:-1], *valid[2:]]]     # missing / extra / short
    h = msgpack.unpackb(head)
    out.append([msgpack.packb({**h, "v": PROTOCOL_VERSION + 7}), *valid[1:]])           # wrong version
    out.append([msgpack.packb({**h, "type": "SandboxResult"}), *valid[1:]])            # wrong type here
    out.append([msgpack.packb({**h, "body": {**h["body"], "zzz": 1}}), *valid[1:]])     # unknown field
    out.append([b"x"] * 100)                                                           # too many frames
    return out


def _raw_dealer(ctx, endpoint):
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(endpoint)
    return s


def _send_oversized(ctx, endpoint, nbytes):
    """A frame above ZMQ_MAXMSGSIZE: ZeroMQ drops that connection before Python sees anything."""
    s = _raw_dealer(ctx, endpoint)
    s.send(b"\0" * nbytes)
    time.sleep(0.2)
    s.close(0)


def _send_each_and_collect_errors(sock, bad: list[list[bytes]], envelope: int = 0) -> list[Error]:
    """Send the bad messages one at a time; each must be answered with an Error before the next goes."""
    errors = []
    for frames in bad:
        sock.send_multipart(frames)
        assert sock.poll(5000), f"no answer to bad message {frames!r:.100}"
        got = recv_frames(sock, limits=Limits(), envelope=envelope)
        errors.append(decode(got[envelope:], (Error,)))
    return errors


def test_trajectory_receiver_survives_garbage(tmp_path):
    rng = random.Random(1)
    ctx = zmq.Context()
    with TrajectoryReceiver("tcp://127.0.0.1:*", tmp_path / "spool").start() as rx:
        valid = [bytes(f) for f in encode(make_trajectory(1, num_tokens=16))]
        bad = _bad_payloads(valid, rng)
        s = _raw_dealer(ctx, rx.endpoint)
        errors = _send_each_and_collect_errors(s, bad)
        assert len(errors) == len(bad) and all(e.code == "bad_message" and e.field for e in errors)
        _send_oversized(ctx, rx.endpoint, (64 << 20) + 1)
        with TrajectoryOutbox(rx.endpoint, actor_id="a") as ob:  # still serving
            ob.put(make_trajectory(2))
            assert ob.flush(timeout_s=10)
        assert rx.stats["bad_messages"] == len(bad) and rx.stats["stored"] == 1
        s.close(0)
    ctx.term()


def test_weights_publisher_survives_garbage():
    rng = random.Random(2)
    ctx = zmq.Context()
    with WeightsPublisher("tcp://127.0.0.1:*", chunk_bytes=1024).start() as pub:
        pub.publish(1, {"w": np.arange(1000, dtype=np.float32)})
        valid = [bytes(f) for f in encode(WeightsChunkRequest(version=1, index=0))]
        bad = _bad_payloads(valid, rng)
        bad.append([bytes(f) for f in encode(WeightsChunkRequest(version=1, index=999))])  # no such chunk
        s = _raw_dealer(ctx, pub.endpoint)
        errors = _send_each_and_collect_errors(s, bad)
        assert len(errors) == len(bad) and all(e.code == "bad_message" for e in errors)
        _send_oversized(ctx, pub.endpoint, 8192)
        with WeightsFetcher(pub.endpoint, timeout_s=5) as f:  # still serving
            update = f.fetch()
            assert update.version == 1 and np.array_equal(update.tensors["w"], np.arange(1000, dtype=np.float32))
        assert pub.stats["bad_messages"] == len(bad)
        s.close(0)
    ctx.term()


def test_rpc_server_survives_garbage():
    rng = random.Random(3)
    ctx = zmq.Context()
    handler = lambda req: SandboxResult(req.message.job_id, "ok", {}, "A")  # noqa: E731
    limits = Limits(max_frame_bytes=1 << 20, max_header_bytes=1 << 20)
    with RpcServer("tcp://127.0.0.1:*", handler, expect=(SandboxJob,), server_id="A", limits=limits).start() as srv:
        valid = [bytes(f) for f in encode(SandboxJob("j", {"id": "t"}, {"a.cu": "x"}, "cpu"))]
        bad = [[b"rid-%d" % i, *frames] for i, frames in enumerate(_bad_payloads(valid, rng))]
        bad.append([b"r" * 65, *valid])  # request id too long
        bad.append([b"only-one-frame"])
        s = _raw_dealer(ctx, srv.endpoint)
        errors = _send_each_and_collect_errors(s, bad, envelope=1)
        assert len(errors) == len(bad) and all(e.code == "bad_message" for e in errors)
        _send_oversized(ctx, srv.endpoint, (1 << 20) + 1)
        with RpcClient([srv.endpoint], expect=(SandboxResult,), heartbeat_s=0.1) as c:  # still serving
            assert c.call(SandboxJob("ok", {}, {}, "cpu"), timeout_s=5).status == "ok"
        assert srv.stats["bad_messages"] == len(bad)
        s.close(0)
    ctx.term()


def test_clients_survive_garbage_replies(tmp_path):
    """The actor-side sockets refuse bad replies too (a broken or hostile server cannot crash an actor)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    with TrajectoryOutbox(endpoint, actor_id="a", resend_after_s=0.2) as ob:
        ob.put(make_trajectory(5))
        peer, *frames = router.recv_multipart()
        for junk in ([b"\xff\x00"], [b"x", b"y"], [bytes(encode(Hello(role="learner", id="l"))[0])[:-3]]):
            router.send_multipart([peer, *junk])
        router.send_multipart([peer, *encode(TrajectoryAck(episode_id="ep-000005"))])
        assert ob.flush(timeout_s=5)
        assert ob.stats["bad_replies"] == 3
    router.close(0)
    ctx.term()
