"""Overload at ten times the queue bound: the node answers "busy" instead of queueing, and its resident memory
grows by no more than 50 MiB while megabyte-sized jobs keep arriving."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from sandbox.client import SandboxClient, SandboxClientError

from _svc_helpers import corpus, job, node_status, rss_bytes, start_node, wait_until

QUEUE_MAX = 4
MiB = 1 << 20


@pytest.mark.slow
def test_ten_times_the_queue_bound_gets_busy_replies_and_bounded_memory(tmp_path):
    node = start_node(tmp_path, f"queue_max={QUEUE_MAX}", "busy_retry_after_s=0.5")
    sols = corpus()
    fast = sols["fast"]
    try:
        with SandboxClient([node.endpoint], attempts=1, heartbeat_s=0.5) as c:
            assert c.wait_for_nodes(timeout_s=60)
            assert c.run(job(fast, salt=uuid.uuid4().hex)).status == "ok"  # warm: every path has run once
            time.sleep(1.0)
            base = rss_bytes(node.info["pid"])
            peak = [base]
            stop = threading.Event()

            def sample():
                while not stop.wait(0.02):
                    peak[0] = max(peak[0], rss_bytes(node.info["pid"]))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            # each job carries 2 MiB of headers: with an unbounded queue (queue_max=64) the same storm grew the
            # node by about 100 MiB on the 2-core box; bounded, it must stay within 50 MiB
            pad = {f"kernels/pad{k}.h": f"/* {k} " + "x" * (256 * 1024 - 16) + " */\n" for k in range(8)}
            futs = []
            for i in range(10 * QUEUE_MAX):
                files = dict(fast.files, **pad)
                files["kernels/elementwise_chain.cpp"] += f"\n// job {i}\n"
                futs.append(c.submit(job(fast, salt=uuid.uuid4().hex, files=files, deadline_s=10.0)))
            results, errors = [], []
            for f in futs:
                try:
                    results.append(f.result(timeout=60))
                except SandboxClientError as e:
                    errors.append(e)
            stop.set()
            sampler.join()
            growth = peak[0] - base
            print(f"overload: {len(results)} results, {len(errors)} errors, {c.rpc.stats['busy']} busy replies, "
                  f"node RSS {base / MiB:.0f} MiB -> peak {peak[0] / MiB:.0f} MiB")
            assert c.rpc.stats["busy"] > 0, "no busy reply seen under 10x overload"
            counts = wait_until(lambda: (s := node_status(c, node.endpoint)["counts"]).get("rejected_busy") and s, 10,
                                "busy rejections in the node's counters")
            assert counts["rejected_busy"] >= 10
            assert results and all(r.status == "ok" for r in results)
            assert errors and all(e.code in ("timeout", "busy") for e in errors)
            assert growth <= 50 * MiB, f"node RSS grew by {growth / MiB:.1f} MiB under overload"
            # after the storm the node serves normally
            assert c.run(job(fast, salt=uuid.uuid4().hex)).status == "ok"
    finally:
        node.stop()
