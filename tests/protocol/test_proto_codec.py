"""Codec and message round trips (property-based) and refusal of bad input with the field named."""

from __future__ import annotations

import math

import ml_dtypes
import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from _proto_helpers import all_message_types, assert_same_message, make_trajectory
from protocol.codec import DTYPES, PROTOCOL_VERSION, Limits, decode, encode
from protocol.errors import ProtocolError
from protocol.handshake import Error, Heartbeat, Hello
from protocol.sandbox_jobs import SandboxJob, SandboxResult
from protocol.sockets import recv_frames, send_message
from protocol.trajectory import Trajectory, TrajectoryAck
from protocol.weights import (WeightsChunk, WeightsChunkRequest, WeightsManifest, WeightsRequest, build_manifest,
                              plan_layout)

ALL_TYPES = all_message_types()

# ---------------------------------------------------------------------------------------------------------
# strategies
ids = st.text(min_size=1, max_size=40)
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
plain_maps = st.dictionaries(st.text(max_size=12), plain, max_size=5)


@st.composite
def trajectories(draw):
    n = draw(st.sampled_from([0, 1, 7, 300, 1 << 15]))
    bounds = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    return Trajectory(
        episode_id=draw(ids), task_id=draw(ids), actor_id=draw(ids), policy_version=draw(st.integers(0, 2**40)),
        tokens=draw(hnp.arrays(np.int32, n)), behaviour_logprobs=draw(hnp.arrays(np.float32, n)),
        loss_mask=draw(hnp.arrays(np.uint8, n)), turn_boundaries=np.array(bounds, dtype=np.int32),
        reward=draw(st.floats(-10, 10)), reward_details=draw(plain_maps), episode_stats=draw(plain_maps),
    )


@st.composite
def manifests(draw):
    tensors = {}
    for i in range(draw(st.integers(0, 5))):
        dt = draw(st.sampled_from(["bfloat16", "float32", "int8", "float16", "float8_e4m3fn"]))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=9))
        tensors[f"layer.{i}.w"] = np.zeros(shape, DTYPES[dt])
    offsets, total = plan_layout(tensors)
    chunk = draw(st.integers(1, 4096))
    crcs = draw(st.lists(st.integers(0, 2**32 - 1), min_size=-(-total // chunk), max_size=-(-total // chunk)))
    return build_manifest(draw(st.integers(0, 2**40)), tensors, offsets, total, chunk, crcs)


@st.composite
def chunks(draw):
    data = draw(st.sampled_from([0, 1, 4095, 1 << 20]))
    return WeightsChunk(version=draw(st.integers(0, 99)), index=draw(st.integers(0, 99)),
                        data=np.frombuffer(np.random.default_rng(data).bytes(data), np.uint8))


paths = st.lists(st.sampled_from(["kernels", "src", "a", "b_c"]), min_size=0, max_size=2).map(
    lambda parts: "/".join(parts + ["f.cu"]))
STRATEGIES = {
    Hello: st.builds(Hello, role=st.sampled_from(["learner", "actor", "sandbox"]), id=ids, capabilities=plain_maps),
    Heartbeat: st.builds(Heartbeat, id=ids, seq=st.integers(0, 2**63), time_s=st.floats(0, 2e9)),
    Error: st.builds(Error, code=st.sampled_from(["busy", "bad_message", "gone"]), message=st.text(max_size=50),
                     field=st.text(max_size=20), request_id=st.text(max_size=20), retry_after_s=st.floats(0, 100)),
    Trajectory: trajectories(),
    TrajectoryAck: st.builds(TrajectoryAck, episode_id=ids, status=st.sampled_from(["stored", "duplicate"])),
    WeightsRequest: st.builds(WeightsRequest, actor_id=ids, known_version=st.integers(-1, 2**40)),
    WeightsManifest: manifests(),
    WeightsChunkRequest: st.builds(WeightsChunkRequest, version=st.integers(0, 2**40), index=st.integers(0, 2**40)),
    WeightsChunk: chunks(),
    SandboxJob: st.builds(SandboxJob, job_id=ids, task=plain_maps,
                          files=st.dictionaries(paths, st.text(max_size=200), max_size=3),
                          format=st.sampled_from(["cubin", "extension", "cpu"]), settings=plain_maps,
                          priority=st.integers(0, 10), deadline_s=st.floats(0.001, 1e4)),
    SandboxResult: st.builds(SandboxResult, job_id=ids, status=st.sampled_from(["ok", "compile_error"]),
                             result=plain_maps, node_id=ids),
}


def test_every_message_type_has_a_strategy():
    assert set(STRATEGIES) == set(ALL_TYPES)


# ---------------------------------------------------------------------------------------------------------
# round trips
@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.TYPE)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip_every_message_type_in_memory(cls, data):
    msg = data.draw(STRATEGIES[cls])
    frames = [bytes(f) for f in encode(msg)]  # as received: separate byte strings
    assert_same_message(msg, decode(frames, ALL_TYPES))


@pytest.fixture(scope="module")
def socket_pair():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    yield a, b
    a.close(0)
    b.close(0)
    ctx.term()


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.TYPE)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_round_trip_every_message_type_over_tcp(socket_pair, cls, data):
    msg = data.draw(STRATEGIES[cls])
    a, b = socket_pair
    tracker = send_message(a, msg, track=True)
    got = decode(recv_frames(b, limits=Limits()), ALL_TYPES)
    tracker.wait(5)
    assert tracker.done
    assert_same_message(msg, got)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_each_travelling_dtype_round_trips_bit_exact(dtype):
    raw = np.random.default_rng(0).bytes(8 * 6 * DTYPES[dtype].itemsize)
    arr = np.frombuffer(raw, DTYPES[dtype]).reshape(8, 6)
    tensors = {"w": arr}
    offsets, total = plan_layout(tensors)
    m = build_manifest(1, tensors, offsets, total, 4096, [0])
    got = decode(encode(m), (WeightsManifest,))
    assert got.dtypes == (dtype,)
    stream = np.frombuffer(arr.tobytes(), np.uint8)
    assert got.tensors_from(stream)["w"].tobytes() == arr.tobytes()
    assert got.tensors_from(stream)["w"].dtype == arr.dtype


def test_decode_is_zero_copy_and_read_only():
    t = make_trajectory(1, num_tokens=1 << 16)
    frames = [bytes(f) for f in encode(t)]
    got = decode(frames, (Trajectory,))
    assert np.shares_memory(got.tokens, np.frombuffer(frames[1], np.uint8))
    assert not got.tokens.flags.writeable


def test_large_bf16_array_is_split_and_joined():
    rng = np.random.default_rng(3)
    data = rng.standard_normal(3 << 20, dtype=np.float32).astype(ml_dtypes.bfloat16)  # 6 MiB
    m = WeightsChunk(version=1, index=0, data=data.view(np.uint8))
    frames = encode(m, split_bytes=1 << 20)
    assert len(frames) == 1 + 6
    header = msgpack.unpackb(frames[0])
    assert header["arrays"] == [["data", "uint8", [6 << 20], 6]]
    got = decode([bytes(f) for f in frames], (WeightsChunk,))
    assert got.data.view(ml_dtypes.bfloat16).tobytes() == data.tobytes()


def test_64_mib_trajectory_arrays_round_trip():
    t = make_trajectory(5, num_tokens=16 << 20)  # 64 MiB of tokens + 64 MiB logprobs + 16 MiB mask
    got = decode(encode(t), (Trajectory,), Limits(max_array_bytes=64 << 20))
    assert_same_message(t, got)


# ---------------------------------------------------------------------------------------------------------
# bad input: ProtocolError naming the field
def _frames(header: dict, *arrays: bytes) -> list[bytes]:
    return [msgpack.packb(header), *arrays]


def _traj_header(**body_changes):
    t = make_trajectory(2, num_tokens=4)
    frames = encode(t)
    header = msgpack.unpackb(frames[0])
    header["body"].update(body_changes)
    return header, [bytes(f) for f in frames[1:]]


def _expect(field: str, frames, types=ALL_TYPES, limits=Limits()):
    with pytest.raises(ProtocolError) as e:
        decode(frames, types, limits)
    assert e.value.field == field, str(e.value)
    return e.value


def test_wrong_version_is_refused():
    h, arrays = _traj_header()
    h["v"] = PROTOCOL_VERSION + 1
    _expect("header.v", _frames(h, *arrays))


def test_unexpected_type_is_refused():
    h, arrays = _traj_header()
    _expect("header.type", _frames(h, *arrays), types=(SandboxJob,))
    h["type"] = "Nope"
    _expect("header.type", _frames(h, *arrays))


@pytest.mark.parametrize("field,value", [
    ("reward", "high"), ("reward", float("nan")), ("policy_version", True), ("policy_version", -1),
    ("episode_id", ""), ("episode_id", 7), ("reward_details", [1, 2]), ("episode_stats", {"a": {1: 2}}),
])
def test_wrong_typed_field_is_named(field, value):
    h, arrays = _traj_header(**{field: value})
    err = _expect(f"Trajectory.{field}" if field != "episode_stats" else "Trajectory.episode_stats.a", _frames(h, *arrays))
    assert err.reason


def test_unknown_and_missing_fields_are_named():
    h, arrays = _traj_header(bogus=1)
    _expect("Trajectory.bogus", _frames(h, *arrays))
    h, arrays = _traj_header()
    del h["body"]["reward"]
    _expect("Trajectory.reward", _frames(h, *arrays))


def test_array_checks():
    h, arrays = _traj_header()
    h["arrays"][0][1] = "int64"  # tokens announced as int64: 4 tokens need 32 bytes, frame has 16
    _expect("Trajectory.tokens", _frames(h, *arrays))
    h, arrays = _traj_header()
    h["arrays"][2][2] = [3]  # loss_mask of 3 with 3 bytes: lengths then disagree
    _expect("Trajectory.loss_mask", _frames(h, *arrays[:2], arrays[2][:3], arrays[3]))
    h, arrays = _traj_header()
    h["arrays"][0][1] = "object"
    _expect("header.arrays[0].dtype", _frames(h, *arrays))
    h, arrays = _traj_header()
    h["arrays"][0][2] = [1 << 40]
    _expect("header.arrays[0].shape", _frames(h, *arrays))
    h, arrays = _traj_header()
    h["arrays"][0][2] = [-1]
    _expect("header.arrays[0].shape", _frames(h, *arrays))
    h, arrays = _traj_header()
    h["arrays"][1][0] = "tokens"
    _expect("header.arrays", _frames(h, *arrays))


def test_truncated_and_extra_frames():
    t = make_trajectory(3, num_tokens=10)
    frames = [bytes(f) for f in encode(t)]
    _expect("header.arrays[3].nframes", frames[:-1], types=(Trajectory,))
    _expect("frames", frames + [b"x"], types=(Trajectory,))
    _expect("header", [frames[0][: len(frames[0]) // 2], *frames[1:]], types=(Trajectory,))
    _expect("Trajectory.tokens", [frames[0], frames[1][:-4], *frames[2:]], types=(Trajectory,))
    _expect("frames", [], types=(Trajectory,))
    _expect("header", [b"\xc1garbage"], types=(Trajectory,))
    _expect("header", [msgpack.packb([1, 2, 3])], types=(Trajectory,))


def test_oversized_input_is_refused_before_decoding():
    t = make_trajectory(4, num_tokens=1000)
    frames = [bytes(f) for f in encode(t)]
    _expect("header", frames, types=(Trajectory,), limits=Limits(max_header_bytes=64))
    _expect("frames", frames, types=(Trajectory,), limits=Limits(max_frames=3))
    _expect("frames", frames, types=(Trajectory,), limits=Limits(max_message_bytes=4000))
    _expect("header.arrays[0].shape", frames, types=(Trajectory,), limits=Limits(max_array_bytes=3999))
    big = Hello(role="actor", id="a", capabilities={"blob": "x" * 5000})
    _expect("header", encode(big), limits=Limits(max_str_bytes=4096))
    many = Hello(role="actor", id="a", capabilities={"l": list(range(100))})
    _expect("header", encode(many), limits=Limits(max_items=50))


def test_non_string_map_keys_and_deep_nesting_are_named():
    h = {"v": PROTOCOL_VERSION, "type": "Hello", "body": {"role": "actor", "id": "a", "capabilities": {1: "x"}},
         "arrays": []}
    _expect("Hello.capabilities", _frames(h))
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["d"] = {}
        node = node["d"]
    h["body"]["capabilities"] = deep
    with pytest.raises(ProtocolError) as e:
        decode(_frames(h), ALL_TYPES)
    assert e.value.field.startswith("Hello.capabilities.d.d") and "deep" in e.value.reason


def test_message_specific_checks():
    with pytest.raises(ProtocolError, match="SandboxJob.files"):
        SandboxJob("j", {}, {"../etc/passwd": "x"}, "cpu")
    with pytest.raises(ProtocolError, match="SandboxJob.files"):
        SandboxJob("j", {}, {"/abs.cu": "x"}, "cpu")
    with pytest.raises(ProtocolError, match="SandboxJob.format"):
        SandboxJob("j", {}, {}, "ptx")
    with pytest.raises(ProtocolError, match="SandboxJob.deadline_s"):
        SandboxJob("j", {}, {}, "cpu", deadline_s=0)
    with pytest.raises(ProtocolError, match="Trajectory.loss_mask"):
        t = make_trajectory(1, num_tokens=5)
        Trajectory(**{**t.__dict__, "loss_mask": np.ones(4, np.uint8)})
    with pytest.raises(ProtocolError, match="Trajectory.tokens"):
        t = make_trajectory(1, num_tokens=5)
        Trajectory(**{**t.__dict__, "tokens": np.ones(5, np.int64)})
    with pytest.raises(ProtocolError, match="Trajectory.turn_boundaries"):
        t = make_trajectory(1, num_tokens=5)
        Trajectory(**{**t.__dict__, "turn_boundaries": np.array([3, 1], np.int32)})
    tensors = {"a": np.zeros(10, np.float32)}
    m = build_manifest(1, tensors, [0], 40, 16, [1, 2, 3])
    frames = encode(m)
    h = msgpack.unpackb(frames[0])
    h["body"]["chunk_crc32"][0] = 99
    _expect("WeightsManifest.checksum", _frames(h))
    h["body"]["offsets"] = [8]
    _expect("WeightsManifest.total_bytes", _frames(h))
    with pytest.raises(ProtocolError, match="dtype"):
        build_manifest(1, {"c": np.zeros(2, np.complex64)}, [0], 16, 16, [0])


def test_numpy_scalars_in_maps_are_normalised_and_pack():
    t = Hello(role="actor", id="a", capabilities={"gpus": np.int64(8), "mem": np.float32(1.5), "ok": np.bool_(True)})
    got = decode(encode(t), (Hello,))
    assert got.capabilities == {"gpus": 8, "mem": 1.5, "ok": True}
    assert math.isclose(got.capabilities["mem"], 1.5)


def test_checksum_is_the_zlib_crc32_whatever_the_implementation():
    import zlib

    from protocol.checksum import crc32

    data = np.random.default_rng(0).bytes((1 << 20) + 13)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[100:], 12345) == zlib.crc32(data[100:], 12345)
    assert crc32(np.frombuffer(data, np.uint8)) == zlib.crc32(data)
