"""Process entry points for the multi-process protocol tests (started with multiprocessing "spawn")."""

from __future__ import annotations

import hashlib
import os
import signal
import time

import ml_dtypes
import numpy as np
import psutil


def version_tensors(version: int, total_mib: int = 24) -> dict[str, np.ndarray]:
    """Deterministic tensors of one weights version: bf16, float32 and int8 of uneven sizes."""
    rng = np.random.default_rng(version)
    out, left, i = {}, total_mib << 20, 0
    while left > 0:
        kind = ("bf16", "f32", "i8")[i % 3]
        nbytes = min(left, int(rng.integers(1, 3 << 20)))
        if kind == "bf16":
            out[f"layer{i}.w"] = rng.standard_normal(max(1, nbytes // 2), dtype=np.float32).astype(ml_dtypes.bfloat16)
        elif kind == "f32":
            out[f"layer{i}.b"] = rng.standard_normal(max(1, nbytes // 4), dtype=np.float32)
        else:
            out[f"layer{i}.q"] = rng.integers(-128, 127, max(1, nbytes), dtype=np.int8)
        left -= nbytes
        i += 1
    return out


def tensors_digest(tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def publisher_main(endpoint_q, commands, replies, chunk_bytes: int, max_credit: int, total_mib: int) -> None:
    """Learner side: a WeightsPublisher; publishes the versions it is told to and reports RSS and stats."""
    from protocol.weights_channel import WeightsPublisher

    pub = WeightsPublisher("tcp://127.0.0.1:*", chunk_bytes=chunk_bytes, max_credit=max_credit).start()
    endpoint_q.put(pub.endpoint)
    proc = psutil.Process()
    while True:
        cmd, arg = commands.get()
        if cmd == "publish":
            tensors = version_tensors(arg, total_mib)
            m = pub.publish(arg, tensors)
            del tensors
            replies.put(("published", arg, m.checksum))
        elif cmd == "rss":
            replies.put(("rss", proc.memory_info().rss, dict(pub.stats)))
        elif cmd == "stop":
            pub.close()
            replies.put(("stopped", dict(pub.stats)))
            return


def actor_main(endpoint: str, actor_id: str, until_version: int, results, total_mib: int) -> None:
    """Actor side: fetch until `until_version` arrives; report each version with its checks."""
    from protocol.weights_channel import WeightsFetcher

    with WeightsFetcher(endpoint, actor_id=actor_id, credit=8, timeout_s=5.0) as f:
        known = -1
        while known < until_version:
            update = f.fetch(known)
            if update is None:
                time.sleep(0.02)
                continue
            expected = tensors_digest(version_tensors(update.version, total_mib))
            results.put((actor_id, update.version, update.manifest.checksum, tensors_digest(update.tensors) == expected))
            known = update.version
        results.put((actor_id, "done", dict(f.stats), None))


def stalled_actor_main(endpoint: str, requests: int, status) -> None:
    """A misbehaving actor: asks for many chunks at once and then never reads."""
    import zmq

    from protocol.codec import Limits, decode
    from protocol.sockets import recv_frames, send_message
    from protocol.weights import WeightsChunkRequest, WeightsManifest, WeightsRequest

    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.rcvhwm = 1
    s.setsockopt(zmq.RCVBUF, 64 << 10)
    s.connect(endpoint)
    send_message(s, WeightsRequest(actor_id="stalled"))
    m = decode(recv_frames(s, limits=Limits(max_items=1 << 20)), (WeightsManifest,))
    for i in range(requests):
        send_message(s, WeightsChunkRequest(version=m.version, index=i % m.num_chunks))
    status.put(("stalled", m.version))
    time.sleep(3600)  # never read again; the test kills this process


def learner_main(endpoint: str, spool_dir: str, ready, kill_after_store_batch: int) -> None:
    """Learner side of the trajectory channel; optionally SIGKILLs itself after storing a batch, before acking."""
    import logging

    from protocol.trajectory_channel import TrajectoryReceiver

    logging.basicConfig(level=logging.ERROR)
    batches = [0]

    def on_stored(ids):
        batches[0] += 1
        if batches[0] == kill_after_store_batch:
            os.kill(os.getpid(), signal.SIGKILL)  # durable but not acked yet

    rx = TrajectoryReceiver(endpoint, spool_dir, max_batch=32, on_stored=on_stored)
    ready.set()
    rx.serve()


def trajectory_actor_main(endpoint: str, actor_id: str, first: int, count: int, pace_s: float, results) -> None:
    """Actor side: send `count` trajectories through an outbox, paced, then wait for every ack."""
    import logging

    from _proto_helpers import make_trajectory
    from protocol.trajectory_channel import TrajectoryOutbox

    logging.basicConfig(level=logging.ERROR)
    with TrajectoryOutbox(endpoint, actor_id=actor_id, window=32, resend_after_s=0.5) as ob:
        for i in range(first, first + count):
            ob.put(make_trajectory(i, num_tokens=256, actor_id=actor_id))
            time.sleep(pace_s)
        flushed = ob.flush(timeout_s=120)
        results.put((actor_id, flushed, dict(ob.stats)))
