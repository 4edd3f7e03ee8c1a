"""The acked trajectory channel and its durable spool: exactly once across learner SIGKILLs."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import socket
import time

import pytest

from _proto_helpers import assert_same_message, make_trajectory
from _proto_workers import learner_main, trajectory_actor_main
from protocol.codec import Limits, encode
from protocol.spool import SpoolPosition, TrajectorySpool
from protocol.trajectory_channel import TRAJECTORY_LIMITS, TrajectoryOutbox, TrajectoryReceiver

CTX = mp.get_context("spawn")


def _read_all(spool: TrajectorySpool):
    out, pos = [], SpoolPosition()
    while True:
        got, pos = spool.read(pos, max_records=500)
        if not got:
            return out, pos
        out += got


# ---------------------------------------------------------------------------------------------------------
# spool
def test_spool_round_trip_rotation_release_and_restart(tmp_path):
    spool = TrajectorySpool(tmp_path, segment_bytes=8 << 10)
    trajs = [make_trajectory(i, num_tokens=100) for i in range(40)]
    for i in range(0, 40, 4):
        spool.append([(t.episode_id, encode(t)) for t in trajs[i:i + 4]])
    assert len(list(tmp_path.glob("seg-*.spool"))) > 2
    got, pos = _read_all(spool)
    assert [t.episode_id for t in got] == [t.episode_id for t in trajs]
    for a, b in zip(trajs, got):
        assert_same_message(a, b)
    half, half_pos = spool.read(SpoolPosition(), max_records=20)
    released = spool.release(half_pos)
    assert released >= 1
    spool.close()

    again = TrajectorySpool(tmp_path)  # restart: seen ids come from seen.log + remaining segments
    assert all(t.episode_id in again for t in trajs)
    assert again.num_seen == 40
    rest, _ = again.read(half_pos, max_records=100)
    assert [t.episode_id for t in rest] == [t.episode_id for t in trajs[20:]]
    again.close()


def test_spool_cuts_a_torn_tail_and_detects_corruption(tmp_path):
    spool = TrajectorySpool(tmp_path)
    trajs = [make_trajectory(i) for i in range(3)]
    spool.append([(t.episode_id, encode(t)) for t in trajs])
    spool.close()
    seg = next(tmp_path.glob("seg-*.spool"))
    size = seg.stat().st_size
    with open(seg, "ab") as f:  # a crash mid-write of a 4th record
        f.write(b"TRJ1" + os.urandom(50))
    again = TrajectorySpool(tmp_path)
    assert seg.stat().st_size == size and again.num_seen == 3 and "ep-000003" not in again
    again.close()
    data = bytearray(seg.read_bytes())
    data[size // 2] ^= 0xFF  # bit rot inside the 2nd record
    seg.write_bytes(bytes(data))
    spool = TrajectorySpool(tmp_path)  # the tail is verified on open: the bad record and after are cut off
    assert spool.num_seen == 1
    spool.close()


def test_spool_read_waits_for_new_records(tmp_path):
    spool = TrajectorySpool(tmp_path)
    got, pos = spool.read(timeout_s=0.05)
    assert got == [] and pos == SpoolPosition()
    t = make_trajectory(9)
    spool.append([(t.episode_id, encode(t))])
    got, pos = spool.read(pos, timeout_s=1)
    assert [x.episode_id for x in got] == ["ep-000009"]
    spool.close()


# ---------------------------------------------------------------------------------------------------------
# channel, one process
def test_ack_means_durable_and_duplicates_are_acked_not_stored(tmp_path):
    stored_batches = []
    with TrajectoryReceiver("tcp://127.0.0.1:*", tmp_path / "spool", on_stored=stored_batches.append).start() as rx:
        with TrajectoryOutbox(rx.endpoint, actor_id="a", window=8) as ob:
            trajs = [make_trajectory(i) for i in range(50)]
            for t in trajs:
                ob.put(t)
            assert ob.flush(timeout_s=20)
            for t in trajs[:10]:  # sent again after the ack (e.g. an actor restarted with its outbox on disk)
                ob.put(t)
            assert ob.flush(timeout_s=20)
            assert ob.stats["acked"] == 60 and ob.stats["duplicates"] == 10
        assert rx.stats["stored"] == 50 and rx.stats["duplicates"] == 10
        assert sum(len(b) for b in stored_batches) == 50
        got, _ = _read_all(rx.spool)
    assert sorted(t.episode_id for t in got) == sorted(t.episode_id for t in trajs)


def test_outbox_holds_until_acked_and_bounds_memory(tmp_path):
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    with TrajectoryOutbox(endpoint, actor_id="a", window=2, max_pending=5, resend_after_s=0.2) as ob:
        for i in range(5):
            ob.put(make_trajectory(i))
        with pytest.raises(TimeoutError):
            ob.put(make_trajectory(99), timeout_s=0.2)  # nobody acks: the outbox is full
        assert ob.pending == 5
        with TrajectoryReceiver(endpoint, tmp_path / "spool").start() as rx:  # the learner comes up late
            assert ob.flush(timeout_s=20)
            assert rx.stats["stored"] == 5


def test_a_trajectory_the_learner_refuses_is_dropped_and_counted(tmp_path):
    limits = Limits(**{**TRAJECTORY_LIMITS.__dict__, "max_array_bytes": 1000})
    with TrajectoryReceiver("tcp://127.0.0.1:*", tmp_path / "spool", limits=limits).start() as rx:
        with TrajectoryOutbox(rx.endpoint, actor_id="a", resend_after_s=0.2) as ob:
            ob.put(make_trajectory(1, num_tokens=1000))  # 4000 bytes of tokens > 1000
            ob.put(make_trajectory(2, num_tokens=10))
            assert ob.flush(timeout_s=20)
            assert ob.stats["rejected"] == 1 and ob.stats["acked"] == 1
        assert rx.stats["bad_messages"] == 1 and rx.stats["stored"] == 1


# ---------------------------------------------------------------------------------------------------------
# channel, several processes, learner SIGKILLed
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_1000_trajectories_arrive_exactly_once_while_the_learner_is_sigkilled_and_restarted(tmp_path):
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    spool_dir = str(tmp_path / "spool")
    rng = random.Random(1234)

    def start_learner(kill_after_store_batch=0):
        ready = CTX.Event()
        p = CTX.Process(target=learner_main, args=(endpoint, spool_dir, ready, kill_after_store_batch))
        p.start()
        assert ready.wait(60), "learner did not start"
        return p

    learner = start_learner(kill_after_store_batch=3)  # 1st kill: durable but not yet acked
    results = CTX.Queue()
    actors = [CTX.Process(target=trajectory_actor_main, args=(endpoint, f"actor-{k}", k * 250, 250, 0.02, results))
              for k in range(4)]
    for a in actors:
        a.start()

    kills = 0
    learner.join(60)
    assert learner.exitcode == -9, "the learner should have killed itself between store and ack"
    kills += 1
    learner = start_learner()
    for _ in range(3):  # SIGKILL at random moments while trajectories flow
        time.sleep(rng.uniform(0.2, 0.8))
        learner.kill()
        learner.join()
        kills += 1
        learner = start_learner()

    reports = []
    for _ in actors:
        try:
            reports.append(results.get(timeout=180))
        except queue.Empty:
            raise AssertionError("an actor did not finish") from None
    for a in actors:
        a.join(30)
    learner.kill()
    learner.join()

    assert kills >= 4
    assert all(flushed for _, flushed, _ in reports), reports
    spool = TrajectorySpool(spool_dir)
    got, _ = _read_all(spool)
    ids = [t.episode_id for t in got]
    assert len(ids) == len(set(ids)) == 1000  # every one, none twice
    assert set(ids) == {f"ep-{i:06d}" for i in range(1000)}
    by_id = {t.episode_id: t for t in got}
    for i in rng.sample(range(1000), 50):
        expected = make_trajectory(i, num_tokens=256, actor_id=f"actor-{i // 250}")
        assert_same_message(expected, by_id[expected.episode_id])
    resent = sum(stats["resent"] for _, _, stats in reports)
    dup = sum(stats["duplicates"] for _, _, stats in reports)
    print(f"kills={kills} resent={resent} duplicate acks={dup}")
    assert resent > 0  # the kills did hit trajectories in flight
    spool.close()


def test_a_failed_write_leaves_no_torn_record_in_front_of_later_ones(tmp_path, monkeypatch):
    import protocol.spool as spool_mod

    spool = TrajectorySpool(tmp_path)
    a, b, c = (make_trajectory(i) for i in range(3))
    spool.append([(a.episode_id, encode(a))])
    real = spool_mod._write_all

    def half_then_fail(fd, bufs):  # the disk fills up half way through a record
        os.write(fd, bytes(memoryview(bufs[0]).cast("B"))[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool_mod, "_write_all", half_then_fail)
    with pytest.raises(OSError):
        spool.append([(b.episode_id, encode(b))])
    monkeypatch.setattr(spool_mod, "_write_all", real)
    assert b.episode_id not in spool
    spool.append([(c.episode_id, encode(c))])
    spool.close()
    again = TrajectorySpool(tmp_path)
    got, _ = _read_all(again)
    assert [t.episode_id for t in got] == [a.episode_id, c.episode_id]
    again.close()
