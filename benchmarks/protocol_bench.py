"""Protocol benchmark: weights transfer against raw pyzmq, acked trajectory throughput, receiver memory.

Usage (from the repository root):
    python benchmarks/protocol_bench.py [--quick] [--repeats 3]

Cases, all over tcp://127.0.0.1 between separate processes:
  weights xN   1 GiB (--quick: 64 MiB, no "raw discard") of bf16 in 256 tensors, from one publisher to N = 1 and 4 actor
               processes at once, 4 MiB chunks, 8 chunk requests in flight per actor.
               ours: WeightsPublisher -> WeightsFetcher.fetch(): manifest, credit window, crc32 check of every
               chunk, copy into one stream buffer, tensors handed over.
               raw:  the same chunk size, credit window, high-water marks and number of subscribers with plain
               pyzmq: ROUTER answers a 4-byte chunk index with the chunk (copy=False), the DEALER keeps every
               received frame (copy=False); no msgpack, no checksum. "raw (discard)" drops each frame on
               arrival: it is the link's ceiling, not a receiver that ends up holding the weights.
               GB/s = N x bytes / (last actor done - first actor started); best of --repeats runs (default 5),
               raw and ours interleaved. `ratio` = ours / raw (keep). Receiver memory: peak RSS (ru_maxrss) of an actor
               process minus its RSS just before the fetch.
  trajectories 8,192-token trajectories (tokens int32, behaviour logprobs float32, loss mask uint8) from 2 actor
               processes through TrajectoryOutbox -> TrajectoryReceiver with the fsync'd spool on local disk:
               acked trajectories/s and MB/s (wire bytes), from the first put to the last ack (5,000;
               --quick: 500).
  Receiver CPU s/GiB (user + system time of the actor processes over the transfer, per GiB received) is
  printed too: unlike GB/s it hardly moves when other jobs share the machine.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CHUNK = 4 << 20
CREDIT = 8
NUM_TENSORS = 256
TOKENS = 8192
CTX = mp.get_context("spawn")


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _weights(total_bytes: int):
    import ml_dtypes
    import numpy as np

    per = total_bytes // NUM_TENSORS // 2
    rng = np.random.default_rng(0)
    base = rng.standard_normal(per, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return {f"layers.{i}.w": np.roll(base, i) for i in range(NUM_TENSORS)}


# ----------------------------------------------------------------------------------------------------------
# weights: ours
def ours_publisher(total_bytes: int, endpoint_q, stop) -> None:
    from protocol.weights_channel import WeightsPublisher

    pub = WeightsPublisher("tcp://127.0.0.1:*", chunk_bytes=CHUNK, max_credit=CREDIT).start()
    t0 = time.perf_counter()
    manifest = pub.publish(1, _weights(total_bytes))
    endpoint_q.put((pub.endpoint, time.perf_counter() - t0, manifest.total_bytes))
    stop.wait()
    pub.close()


def ours_actor(endpoint: str, ready, go, results) -> None:
    from protocol.weights_channel import WeightsFetcher

    with WeightsFetcher(endpoint, credit=CREDIT, timeout_s=30) as f:
        f.newest_manifest()  # connected
        idle = _rss()
        ready.release()
        go.wait()
        cpu0, start = _cpu_s(), time.time()
        update = f.fetch()
        end = time.time()
        nbytes = sum(t.nbytes for t in update.tensors.values())
        results.put((start, end, nbytes, _peak_rss() - idle, _cpu_s() - cpu0))


# ----------------------------------------------------------------------------------------------------------
# weights: raw pyzmq
def raw_publisher(total_bytes: int, endpoint_q, stop) -> None:
    import numpy as np
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.sndhwm = 2 * CREDIT + 4  # the same HWM as WeightsPublisher
    sock.router_mandatory = True
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stream = np.concatenate([w.reshape(-1).view(np.uint8) for w in _weights(total_bytes).values()])
    chunks = [stream[i:i + CHUNK].copy() for i in range(0, len(stream), CHUNK)]
    del stream
    endpoint_q.put((f"tcp://127.0.0.1:{port}", 0.0, sum(len(c) for c in chunks)))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while not stop.is_set():
        if not poller.poll(100):
            continue
        while True:
            try:
                peer, req = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            index = int.from_bytes(req, "little")
            if index == 0xFFFFFFFF:
                sock.send_multipart([peer, len(chunks).to_bytes(4, "little")])
            else:
                sock.send_multipart([peer, chunks[index]], copy=False)
    sock.close(0)
    ctx.term()


def raw_actor(endpoint: str, ready, go, results, keep: bool) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.rcvhwm = CREDIT + 4
    sock.connect(endpoint)
    sock.send((0xFFFFFFFF).to_bytes(4, "little"))
    n = int.from_bytes(sock.recv(), "little")
    idle = _rss()
    ready.release()
    go.wait()
    cpu0, start = _cpu_s(), time.time()
    kept, nbytes, sent = [], 0, 0
    while sent < min(CREDIT, n):
        sock.send(sent.to_bytes(4, "little"))
        sent += 1
    for _ in range(n):
        frame = sock.recv(copy=False)
        nbytes += len(frame)
        if keep:
            kept.append(frame)
        if sent < n:
            sock.send(sent.to_bytes(4, "little"))
            sent += 1
    end = time.time()
    results.put((start, end, nbytes, _peak_rss() - idle, _cpu_s() - cpu0))
    sock.close(0)
    ctx.term()


def run_weights_trial(kind: str, endpoint: str, subscribers: int) -> tuple[float, float, float]:
    """(aggregate GB/s, max receiver peak extra bytes, receiver CPU s per GiB) of one transfer to
    `subscribers` actors."""
    ready, go, results = CTX.Semaphore(0), CTX.Event(), CTX.Queue()
    if kind == "ours":
        procs = [CTX.Process(target=ours_actor, args=(endpoint, ready, go, results)) for _ in range(subscribers)]
    else:
        keep = kind == "raw_keep"
        procs = [CTX.Process(target=raw_actor, args=(endpoint, ready, go, results, keep)) for _ in range(subscribers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    go.set()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(o[1] for o in out) - min(o[0] for o in out)
    total = sum(o[2] for o in out)
    return total / wall / 1e9, max(o[3] for o in out), sum(o[4] for o in out) / (total / 2**30)


def bench_weights(total_bytes: int, repeats: int, subscriber_counts: list[int], kinds: tuple[str, ...]) -> list[dict]:
    servers = {}
    stops = []
    for kind, target in (("ours", ours_publisher), ("raw", raw_publisher)):
        q, stop = CTX.Queue(), CTX.Event()
        p = CTX.Process(target=target, args=(total_bytes, q, stop))
        p.start()
        servers[kind] = q.get(timeout=600)
        stops.append((p, stop))
    rows = []
    try:
        for n in subscriber_counts:
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(repeats):
                for kind in kinds:
                    endpoint = servers["ours" if kind == "ours" else "raw"][0]
                    r = run_weights_trial(kind, endpoint, n)
                    if kind not in best or r[0] > best[kind][0]:
                        best[kind] = r
            rows.append(dict(subscribers=n, bytes=servers["ours"][2], publish_s=servers["ours"][1],
                             ours=best["ours"][0], raw_keep=best["raw_keep"][0],
                             raw_discard=best["raw_discard"][0] if "raw_discard" in best else float("nan"),
                             ratio=best["ours"][0] / best["raw_keep"][0],
                             mem_ours=best["ours"][1], mem_raw=best["raw_keep"][1],
                             cpu_ours=best["ours"][2], cpu_raw=best["raw_keep"][2]))
    finally:
        for p, stop in stops:
            stop.set()
            p.join()
    return rows


# ----------------------------------------------------------------------------------------------------------
# trajectories
def learner(endpoint_q, spool_dir: str, stop, stats_q) -> None:
    from protocol.trajectory_channel import TrajectoryReceiver

    rx = TrajectoryReceiver("tcp://127.0.0.1:*", spool_dir).start()
    endpoint_q.put(rx.endpoint)
    stop.wait()
    stats_q.put(dict(rx.stats))
    rx.close()


def trajectory_actor(endpoint: str, actor: int, count: int, ready, go, results) -> None:
    import numpy as np

    from protocol.codec import encode
    from protocol.trajectory import Trajectory
    from protocol.trajectory_channel import TrajectoryOutbox

    rng = np.random.default_rng(actor)
    base = [dict(tokens=rng.integers(0, 150_000, TOKENS, dtype=np.int32),
                 behaviour_logprobs=-rng.random(TOKENS, dtype=np.float32),
                 loss_mask=(rng.random(TOKENS) < 0.6).astype(np.uint8)) for _ in range(16)]
    trajs = [Trajectory(episode_id=f"a{actor}-{i}", task_id="t", actor_id=f"a{actor}", policy_version=1,
                        turn_boundaries=np.array([0, 1000, 4000], np.int32), reward=1.0,
                        reward_details={"speedup": 1.2}, episode_stats={"turns": 3}, **base[i % 16])
             for i in range(count)]
    wire = sum(len(memoryview(f).cast("B")) for f in encode(trajs[0]))
    with TrajectoryOutbox(endpoint, actor_id=f"a{actor}", window=64) as ob:
        ready.release()
        go.wait()
        start = time.time()
        for t in trajs:
            ob.put(t)
        assert ob.flush(timeout_s=600)
        end = time.time()
    results.put((start, end, count, wire))


def bench_trajectories(count: int, actors: int = 2) -> dict:
    with tempfile.TemporaryDirectory(dir=os.environ.get("SPOOL_DIR")) as d:
        q, stop, stats_q = CTX.Queue(), CTX.Event(), CTX.Queue()
        lp = CTX.Process(target=learner, args=(q, d, stop, stats_q))
        lp.start()
        endpoint = q.get(timeout=60)
        ready, go, results = CTX.Semaphore(0), CTX.Event(), CTX.Queue()
        procs = [CTX.Process(target=trajectory_actor, args=(endpoint, a, count // actors, ready, go, results))
                 for a in range(actors)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.acquire()
        go.set()
        out = [results.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        stop.set()
        stats = stats_q.get(timeout=60)
        lp.join()
    wall = max(o[1] for o in out) - min(o[0] for o in out)
    n = sum(o[2] for o in out)
    return dict(count=n, per_s=n / wall, mb_s=n * out[0][3] / wall / 1e6, wire_bytes=out[0][3],
                batches=stats["batches"], stored=stats["stored"])


# ----------------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, finishes in under 30 s")
    ap.add_argument("--repeats", type=int, default=None, help="runs per weights case (best is kept)")
    args = ap.parse_args()
    total = (64 << 20) if args.quick else (1 << 30)
    repeats = args.repeats or (1 if args.quick else 5)
    count = 500 if args.quick else 5000
    kinds = ("raw_keep", "ours") if args.quick else ("raw_keep", "ours", "raw_discard")

    from rich.console import Console
    from rich.table import Table

    t0 = time.time()
    load0 = os.getloadavg()
    rows = bench_weights(total, repeats, [1, 4], kinds)
    traj = bench_trajectories(count)

    console = Console(width=160)
    console.print(f"protocol_bench {'--quick ' if args.quick else ''}{datetime.date.today()} on {platform.node()} "
                  f"({os.cpu_count()} CPUs, Python {platform.python_version()}), repeats={repeats}, "
                  f"load average before {load0[0]:.1f} / after {os.getloadavg()[0]:.1f}")
    table = Table(title=f"weights: {total >> 20} MiB bf16 in {NUM_TENSORS} tensors, {CHUNK >> 20} MiB chunks, "
                        f"credit {CREDIT}, tcp loopback")
    for col in ("subscribers", "ours GB/s", "raw keep GB/s", "raw discard GB/s", "ratio ours/raw keep",
                "receiver peak extra MiB (ours / raw keep)", "receiver CPU s/GiB (ours / raw keep)", "publish s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["subscribers"]), f"{r['ours']:.2f}", f"{r['raw_keep']:.2f}", f"{r['raw_discard']:.2f}",
                      f"{r['ratio']:.2f}", f"{r['mem_ours'] / 2**20:.0f} / {r['mem_raw'] / 2**20:.0f}",
                      f"{r['cpu_ours']:.2f} / {r['cpu_raw']:.2f}", f"{r['publish_s']:.2f}")
    console.print(table)
    t2 = Table(title=f"trajectories: {TOKENS} tokens, 2 actor processes -> learner, fsync'd spool")
    for col in ("trajectories", "acked trajectories/s", "MB/s", "wire bytes each", "fsync batches"):
        t2.add_column(col, justify="right")
    t2.add_row(str(traj["count"]), f"{traj['per_s']:.0f}", f"{traj['mb_s']:.1f}", str(traj["wire_bytes"]),
               str(traj["batches"]))
    console.print(t2)
    for r in rows:
        print(f"weights x{r['subscribers']}: ratio {r['ratio']:.2f}  (receiver CPU ratio raw/ours "
              f"{r['cpu_raw'] / r['cpu_ours']:.2f})")
    print(f"total {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
