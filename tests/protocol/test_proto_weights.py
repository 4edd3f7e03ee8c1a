"""Weights learner -> actors across processes over tcp://127.0.0.1: versions, checksums, late joiner,
a stalled reader, bounded publisher memory."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import zlib

import ml_dtypes
import numpy as np
import pytest
import zmq

from _proto_workers import actor_main, publisher_main, stalled_actor_main, tensors_digest, version_tensors
from protocol.codec import Limits, decode
from protocol.sockets import send_message
from protocol.weights import WeightsChunk, WeightsChunkRequest, WeightsRequest, build_manifest, plan_layout
from protocol.weights_channel import WeightsFetcher, WeightsPublisher

CTX = mp.get_context("spawn")
MIB = 1 << 20


def _get(q, timeout=60):
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError("a worker process did not answer in time") from None


@pytest.fixture
def publisher_proc():
    """A publisher in its own process: (endpoint, commands, replies)."""
    procs = []

    def start(chunk_bytes=1 * MIB, max_credit=16, total_mib=24):
        endpoint_q, commands, replies = CTX.Queue(), CTX.Queue(), CTX.Queue()
        p = CTX.Process(target=publisher_main, args=(endpoint_q, commands, replies, chunk_bytes, max_credit, total_mib))
        p.start()
        procs.append(p)
        return _get(endpoint_q), commands, replies

    yield start
    for p in procs:
        p.kill()
        p.join()


def _await_version(results, actor_ids, version, checksum, done):
    """Read actor reports until every actor in `actor_ids` has verified `version` (and no other is wrong);
    "done" reports are collected into `done`."""
    seen = set()
    while seen != set(actor_ids):
        actor_id, v, a, b = _get(results)
        if v == "done":
            done[actor_id] = a
            continue
        assert b, f"{actor_id}: tensors of v{v} differ from what was published"
        if v == version:
            assert a == checksum, actor_id
            seen.add(actor_id)


def _publish(commands, replies, version):
    commands.put(("publish", version))
    kind, v, checksum = _get(replies)
    assert (kind, v) == ("published", version)
    return checksum


def test_versions_1_to_3_reach_three_actor_processes_and_a_late_joiner_gets_the_newest(publisher_proc):
    endpoint, commands, replies = publisher_proc(total_mib=24)
    results = CTX.Queue()
    actors = [CTX.Process(target=actor_main, args=(endpoint, f"actor-{i}", 3, results, 24)) for i in range(3)]
    for a in actors:
        a.start()
    checksums, done = {}, {}
    ids = [f"actor-{i}" for i in range(3)]
    for version in (1, 2, 3):  # every actor verifies a version before the next is published
        checksums[version] = _publish(commands, replies, version)
        _await_version(results, ids, version, checksums[version], done)
    while len(done) < 3:
        actor_id, v, stats, _ = _get(results)
        assert v == "done"
        done[actor_id] = stats
    for stats in done.values():
        assert stats["fetches"] == 3 and stats["crc_failures"] == 0
    for a in actors:
        a.join(30)
        assert a.exitcode == 0

    late = CTX.Process(target=actor_main, args=(endpoint, "late", 3, results, 24))
    late.start()
    actor_id, v, checksum, content_ok = _get(results)
    assert (actor_id, v, checksum, content_ok) == ("late", 3, checksums[3], True)  # the newest, not v1
    assert _get(results)[1] == "done"
    late.join(30)
    commands.put(("stop", None))
    kind, stats = _get(replies)
    assert stats["manifests_sent"] >= 4 * 1 and stats["chunks_sent"] >= 10 * 24


def test_a_stalled_reader_does_not_delay_others_and_publisher_memory_stays_bounded(publisher_proc):
    chunk, credit, size_mib, last = 1 * MIB, 8, 8, 9
    endpoint, commands, replies = publisher_proc(chunk_bytes=chunk, max_credit=credit, total_mib=size_mib)
    _publish(commands, replies, 1)
    commands.put(("rss", None))
    _, rss_v1, _ = _get(replies)

    status = CTX.Queue()
    stalled = CTX.Process(target=stalled_actor_main, args=(endpoint, 4000, status))
    stalled.start()
    assert _get(status) == ("stalled", 1)

    results = CTX.Queue()
    actors = [CTX.Process(target=actor_main, args=(endpoint, f"actor-{i}", last, results, size_mib)) for i in range(2)]
    for a in actors:
        a.start()
    done = {}
    for version in range(2, last + 1):
        checksum = _publish(commands, replies, version)
        _await_version(results, ["actor-0", "actor-1"], version, checksum, done)
    assert stalled.is_alive()  # it never read, yet the others got every version
    commands.put(("rss", None))
    _, rss_last, stats = _get(replies)
    print(f"publisher RSS growth v1 -> v{last}: {(rss_last - rss_v1) / MIB:.1f} MiB, stats {stats}")
    assert stats["dropped"] > 0  # its queue filled: chunks for it were dropped, not waited on
    # kept versions (2) + reusable buffers (1 version) + the stalled peer's queue (2 * credit + 4 chunks)
    bound = (3 * size_mib + (2 * credit + 4) * chunk // MIB) * MIB
    # (keeping every version would grow by (last - 1) * size_mib = 64 MiB)
    assert rss_last - rss_v1 < bound + 8 * MIB, (rss_last - rss_v1) / MIB
    for a in actors:
        a.join(30)
        assert a.exitcode == 0
    stalled.kill()
    stalled.join()


def test_in_process_fetch_is_exact_for_bf16_and_odd_sizes():
    tensors = {"emb": np.arange(12345, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(15, 823),
               "norm": np.ones(7, np.float32), "empty": np.zeros((0, 4), np.int8), "scalar": np.array(3.5, np.float64)}
    with WeightsPublisher("tcp://127.0.0.1:*", chunk_bytes=4096).start() as pub, \
            WeightsFetcher(pub.endpoint, credit=3, timeout_s=5) as fetcher:
        assert fetcher.fetch() is None  # nothing published yet
        m = pub.publish(7, tensors)
        update = fetcher.fetch()
        assert update.version == 7 and update.manifest.checksum == m.checksum
        for name, a in tensors.items():
            got = update.tensors[name]
            assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes(), name
        assert fetcher.fetch(known_version=7) is None
        with pytest.raises(ValueError):
            pub.publish(7, tensors)
        assert tensors_digest(update.tensors) == tensors_digest(tensors)
        assert not update.tensors["norm"].flags.writeable  # inside one chunk: a view of the received frame
        assert len(update.buffers) == 1 and np.shares_memory(update.tensors["emb"], update.buffers[0])  # joined
        fetcher.recycle(update)  # done with v7: the next fetch writes into its buffers
        tensors8 = {k: (v + 1 if v.dtype != ml_dtypes.bfloat16 else -v) for k, v in tensors.items()}
        pub.publish(8, tensors8)
        update8 = fetcher.fetch(known_version=7)
        assert np.shares_memory(update8.tensors["emb"], update.buffers[0])
        assert tensors_digest(update8.tensors) == tensors_digest(tensors8)


def test_a_version_retired_mid_fetch_restarts_at_the_newest():
    with WeightsPublisher("tcp://127.0.0.1:*", chunk_bytes=64 << 10, keep_versions=1).start() as pub, \
            WeightsFetcher(pub.endpoint, credit=2, timeout_s=5) as fetcher:
        pub.publish(1, version_tensors(1, 2))
        manifest = fetcher.newest_manifest()
        pub.publish(2, version_tensors(2, 2))  # v1 is retired now
        assert fetcher._pull(manifest, timeout_s=5) is None  # "gone"
        update = fetcher.fetch()
        assert update.version == 2 and tensors_digest(update.tensors) == tensors_digest(version_tensors(2, 2))


def test_retired_chunk_buffers_are_reused_only_after_zeromq_released_them():
    with WeightsPublisher("tcp://127.0.0.1:*", chunk_bytes=64 << 10, keep_versions=1).start() as pub, \
            WeightsFetcher(pub.endpoint, credit=4, timeout_s=5) as fetcher:
        pub.publish(1, version_tensors(1, 1))
        first = {id(b) for b in pub._versions[1][1]}
        assert fetcher.fetch().version == 1
        pub.publish(2, version_tensors(2, 1))
        pub.publish(3, version_tensors(3, 1))  # takes v1's released buffers from the pool
        reused = first & {id(b) for b in pub._versions[3][1]}
        assert reused, "no buffer of the retired version was reused"
        for b in pub._versions[3][1]:
            assert all(t.done for t in pub._trackers.get(id(b), []))
        assert tensors_digest(fetcher.fetch().tensors) == tensors_digest(version_tensors(3, 1))


@pytest.mark.parametrize("verify_workers", [0, 2])
def test_a_corrupted_chunk_is_caught_by_its_crc32_and_fetched_again(verify_workers):
    """A publisher (hand-driven ROUTER) whose first send of chunk 1 has a flipped bit."""
    tensors = {"w": np.arange(3000, dtype=np.float32)}
    offsets, total = plan_layout(tensors)
    stream = np.frombuffer(tensors["w"].tobytes(), np.uint8)
    chunk = 4096
    chunks = [stream[i:i + chunk] for i in range(0, total, chunk)]
    manifest = build_manifest(3, tensors, offsets, total, chunk, [zlib.crc32(c) for c in chunks])
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve():
        corrupted = False
        while not stop.is_set():
            if not router.poll(50):
                continue
            peer, *frames = router.recv_multipart(copy=False)
            req = decode(frames, (WeightsRequest, WeightsChunkRequest), Limits())
            if isinstance(req, WeightsRequest):
                send_message(router, manifest, envelope=[peer.bytes])
                continue
            data = chunks[req.index].copy()
            if req.index == 1 and not corrupted:
                data[17] ^= 0x40
                corrupted = True
            send_message(router, WeightsChunk(version=3, index=req.index, data=data), envelope=[peer.bytes])

    t = threading.Thread(target=serve)
    t.start()
    try:
        with WeightsFetcher(f"tcp://127.0.0.1:{port}", credit=2, timeout_s=5, verify_workers=verify_workers) as f:
            update = f.fetch()
            assert f.stats["crc_failures"] == 1
            assert update.tensors["w"].tobytes() == tensors["w"].tobytes()
    finally:
        stop.set()
        t.join()
        router.close(0)
        ctx.term()
