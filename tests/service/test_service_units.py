"""Node parts that need no node: queue order and bound, result store bounds, job settings, content keys, the
timing lock (real flock between real processes), and capacity spreading in protocol.rpc (real sockets)."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import time

import pytest

from protocol.handshake import Error
from protocol.rpc import RpcClient, RpcServer
from protocol.sandbox_jobs import SandboxJob, SandboxResult
from sandbox.config import SandboxConfig
from protocol.auth import is_loopback
from sandbox.service import BadJob, SandboxNode, ServiceConfig, content_key, job_settings
from sandbox.service_lock import DeviceTimingLock
from sandbox.service_queue import JobQueue, QueuedJob, ResultStore
from tasks.schema import Task

from _svc_helpers import corpus


# ------------------------------------------------------------------------------------------------ queue
def test_queue_serves_priority_then_deadline_then_arrival_and_is_bounded():
    q = JobQueue(4)
    now = time.monotonic()
    jobs = [QueuedJob("t-late", 1, now + 50, "t-late"), QueuedJob("t-early", 1, now + 10, "t-early"),
            QueuedJob("eval", 0, now + 100, "eval"), QueuedJob("t-early-2", 1, now + 10, "t-early-2")]
    for j in jobs:
        assert q.push(j)
    assert q.full() and not q.push(QueuedJob("extra", 0, now, "extra"))
    assert q.ahead_of(0) == 1 and q.ahead_of(1) == 4
    order = [q.pop().payload for _ in range(4)]
    assert order == ["eval", "t-early", "t-early-2", "t-late"]
    assert q.pop() is None


def test_queue_handed_back_job_keeps_its_place_even_when_full():
    q = JobQueue(2)
    now = time.monotonic()
    first = QueuedJob("a", 1, now + 5, "a")
    q.push(first)
    q.push(QueuedJob("b", 1, now + 5, "b"))
    taken = q.pop()
    q.push(QueuedJob("c", 1, now + 5, "c"))
    assert q.full()
    assert q.push(taken, force=True)  # its worker died: it goes back at the head
    assert [q.pop().payload for _ in range(3)] == ["a", "b", "c"]


# ------------------------------------------------------------------------------------------------ store
def _result(i: int, pad: int = 0) -> dict:
    return {"status": "ok", "reward": float(i), "log": ["x" * pad]}


def test_result_store_by_job_id_and_content_within_a_byte_bound():
    st = ResultStore(max_bytes=3000, max_job_ids=100, job_id_ttl_s=60)
    st.put("j1", "k1", _result(1, 900), reusable=True)
    assert st.by_job("j1")["reward"] == 1.0 and st.by_content("k1")["reward"] == 1.0
    st.put("j2", "k2", _result(2, 900), reusable=False)  # e.g. contended: job id only
    assert st.by_job("j2")["reward"] == 2.0 and st.by_content("k2") is None
    for i in range(3, 8):
        st.put(f"j{i}", f"k{i}", _result(i, 900), reusable=True)
    assert st.size_bytes <= 3000
    assert st.by_job("j1") is None and st.by_content("k1") is None  # evicted (LRU) by bytes
    assert st.by_job("j7")["reward"] == 7.0
    assert st.hits["job_id"] >= 3 and st.hits["content"] >= 1


def test_result_store_forgets_job_ids_after_ttl_and_can_refuse_reuse():
    st = ResultStore(max_bytes=1 << 20, max_job_ids=2, job_id_ttl_s=0.2, reuse_by_content=False)
    st.put("a", "ka", _result(1), reusable=True)
    assert st.by_content("ka") is None and st.by_job("a") is not None
    st.put("b", "kb", _result(2), reusable=True)
    st.put("c", "kc", _result(3), reusable=True)
    assert st.by_job("a") is None  # count bound
    time.sleep(0.3)
    assert st.by_job("c") is None  # age bound


# ------------------------------------------------------------------------------------------------ settings, keys
def test_job_settings_accept_evaluation_settings_and_refuse_the_rest():
    base = SandboxConfig(backend="cpu")
    over, salt = job_settings({"num_trials": 2, "atol": 1, "use_compile": False, "cache_salt": "s1",
                               "trial_timeout_s": 5}, base)
    assert over == {"num_trials": 2, "atol": 1.0, "use_compile": False, "trial_timeout_s": 5.0} and salt == "s1"
    with pytest.raises(BadJob) as e:
        job_settings({"isolation": "none"}, base)
    assert e.value.field == "SandboxJob.settings.isolation"
    with pytest.raises(BadJob, match="expected int"):
        job_settings({"num_trials": "5"}, base)
    with pytest.raises(BadJob, match="above this node's limit"):
        job_settings({"trial_timeout_s": base.trial_timeout_s * 2}, base)
    with pytest.raises(BadJob, match="expected bool"):
        job_settings({"profile": 1}, base)


def test_content_key_covers_task_files_format_settings_and_salt():
    sol = corpus()["fast"]
    task = Task.from_dict(sol.task)
    cfg = SandboxConfig(backend="cpu")
    k = content_key(task, sol.files, "cpu", cfg)
    assert k == content_key(task, dict(reversed(list(sol.files.items()))), "cpu", cfg)
    other_files = dict(sol.files, **{"model_new.py": sol.files["model_new.py"] + "\n# edit\n"})
    changed = [content_key(task, other_files, "cpu", cfg), content_key(task, sol.files, "cubin", cfg),
               content_key(task, sol.files, "cpu", SandboxConfig(backend="cpu", num_trials=3)),
               content_key(task, sol.files, "cpu", cfg, salt="again"),
               content_key(task.replace(atol=0.5), sol.files, "cpu", cfg)]
    assert len({k, *changed}) == 6
    # what does not decide a result does not change the key
    assert content_key(task.replace(name="renamed"), sol.files, "cpu", SandboxConfig(backend="cpu", keep_workspaces=True)) == k


def test_loopback_detection_and_curve_required_beyond_it():
    assert is_loopback("tcp://127.0.0.1:5557") and is_loopback("tcp://localhost:1") and is_loopback("ipc:///tmp/x")
    assert is_loopback("tcp://[::1]:5") and not is_loopback("tcp://*:5557") and not is_loopback("tcp://10.0.0.2:1")
    with pytest.raises(ValueError, match="needs CURVE keys"):
        SandboxNode(ServiceConfig(endpoint="tcp://0.0.0.0:0", sandbox=SandboxConfig(backend="cpu")))


# ------------------------------------------------------------------------------------------------ timing lock
def _hold_shared(lock_dir: str, key: str, started, release) -> None:
    with DeviceTimingLock(key, lock_dir).shared() as got:
        assert got
        started.set()
        release.wait(30)


def _try_shared(lock_dir: str, key: str, trying, out) -> None:
    lock = DeviceTimingLock(key, lock_dir)
    trying.set()
    with lock.shared(timeout_s=20) as got:
        out.put((got, time.time()))


def test_timing_lock_waits_for_other_users_flags_contention_and_has_writer_preference(tmp_path):
    ctx = mp.get_context("spawn")
    lock_dir = str(tmp_path / "locks")
    lock = DeviceTimingLock("gpu-test", lock_dir)
    started, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_shared, args=(lock_dir, "gpu-test", started, release))
    holder.start()
    try:
        assert started.wait(30)
        assert lock.timing_requested() is False
        with lock.timing(timeout_s=0.3) as st:  # a sampler step is running: cannot have the device
            assert not st.acquired and st.wait_ms >= 250
        release.set()
        holder.join(30)
        with lock.timing(timeout_s=5) as st:
            assert st.acquired
            assert lock.timing_requested() is True
            out, trying = ctx.Queue(), ctx.Event()
            waiter = ctx.Process(target=_try_shared, args=(lock_dir, "gpu-test", trying, out))
            waiter.start()
            assert trying.wait(30)
            time.sleep(0.4)
            assert out.empty()  # a new shared user waits while the timer holds the device
            released_at = time.time()
        got, acquired_at = out.get(timeout=10)
        waiter.join(10)
        assert got and acquired_at >= released_at
    finally:
        release.set()
        holder.join(5)
    mode = stat.S_IMODE(os.stat(lock.lock_path).st_mode)
    assert mode & 0o077 == 0, f"lock file must be owner-only, is {oct(mode)}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to the sandbox uid")
def test_timing_lock_cannot_be_opened_by_the_sandbox_uid(tmp_path):
    lock = DeviceTimingLock("gpu-x", tmp_path / "locks")
    with lock.timing(1.0):
        pass
    pid = os.fork()
    if pid == 0:  # child: become the candidates' uid and try to open the lock file
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            fd = os.open(lock.lock_path, os.O_RDONLY)
            os.close(fd)
            code = 1
        except PermissionError:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


# ------------------------------------------------------------------------------------------------ rpc capacity
def _echo_server(free: int) -> RpcServer:
    def handler(req):
        j = req.message
        return SandboxResult(job_id=j.job_id, status="ok", result={"free": free}, node_id=str(free))

    return RpcServer("tcp://127.0.0.1:0", handler, expect=(SandboxJob,), server_id=f"s{free}",
                     status=lambda: {"free": free, "queued": 0}).start()


def test_rpc_client_spreads_by_advertised_free_capacity():
    roomy, full = _echo_server(6), _echo_server(-3)
    try:
        with RpcClient([full.endpoint, roomy.endpoint], expect=(SandboxResult,), heartbeat_s=0.1) as c:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not all(v["status"] for v in c.endpoint_status().values()):
                time.sleep(0.05)
            assert c.endpoint_status()[roomy.endpoint]["status"]["free"] == 6
            sol = corpus()["fast"]
            futs = [c.submit(SandboxJob(job_id=f"j{i}", task=sol.task, files=sol.files, format="cpu"), timeout_s=5)
                    for i in range(5)]
            nodes = [f.result(10).node_id for f in futs]
        # five jobs fit in the roomy node's advertised free slots (6, less what this client sent since)
        assert nodes == ["6"] * 5
    finally:
        roomy.close()
        full.close()


def test_rpc_status_failure_does_not_stop_heartbeats():
    def bad_status():
        raise RuntimeError("boom")

    srv = RpcServer("tcp://127.0.0.1:0", lambda r: Error(code="busy"), expect=(SandboxJob,), status=bad_status).start()
    try:
        with RpcClient([srv.endpoint], expect=(SandboxResult,), heartbeat_s=0.1, liveness=3) as c:
            time.sleep(0.8)
            assert c.alive_endpoints() == [srv.endpoint]
        assert srv.stats["heartbeats"] >= 3
    finally:
        srv.close()


def test_rpc_client_resends_to_another_endpoint_when_one_does_not_answer():
    silent = RpcServer("tcp://127.0.0.1:0", lambda r: None, expect=(SandboxJob,), server_id="silent",
                       status=lambda: {"free": 100}).start()  # takes every job, answers none
    answering = _echo_server(1)
    sol = corpus()["fast"]
    try:
        with RpcClient([silent.endpoint, answering.endpoint], expect=(SandboxResult,), heartbeat_s=0.1) as c:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not all(v["status"] for v in c.endpoint_status().values()):
                time.sleep(0.05)
            t0 = time.monotonic()
            res = c.submit(SandboxJob(job_id="j", task=sol.task, files=sol.files, format="cpu"), timeout_s=0.5,
                           attempts=3).result(10)
            assert res.node_id == "1" and c.stats["resends"] == 1 and c.stats["timeouts"] == 1
            assert 0.5 <= time.monotonic() - t0 < 3
        assert silent.stats["requests"] == 1
    finally:
        silent.close()
        answering.close()


def test_visible_gpu_key_names_the_physical_gpu_behind_a_cuda_ordinal(monkeypatch):
    """CUDA_VISIBLE_DEVICES renumbers GPUs: ordinal k is its k-th entry (a UUID is the key itself); without the
    variable (or past its end) the ordinal is the index. The sampler, the filter and the node agree through it."""
    from sandbox.service_lock import gpu_device_key, visible_gpu_key

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-AAA, GPU-BBB")
    assert visible_gpu_key(0) == "gpu-aaa" and visible_gpu_key(1) == "gpu-bbb"
    assert visible_gpu_key(2) == gpu_device_key(2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_key() == gpu_device_key("0")


def test_shared_use_waits_out_a_timer_and_only_runs_unlocked_with_a_timeout(tmp_path):
    """sandbox.service_lock.SharedUse: without a timeout, untimed work waits for as long as a timer holds the lock
    (it never runs beside a timing); with one, it goes on once the timeout passes and says so (`got` False)."""
    import threading
    import time

    from sandbox.service_lock import DeviceTimingLock, SharedUse

    lock = DeviceTimingLock("gpu-shared-use", tmp_path)
    inside, release = threading.Event(), threading.Event()

    def timer() -> None:
        with lock.timing(timeout_s=5.0) as st:
            assert st.acquired
            inside.set()
            release.wait(10)

    t = threading.Thread(target=timer)
    t.start()
    assert inside.wait(5)
    threading.Timer(0.5, release.set).start()
    t0 = time.monotonic()
    with SharedUse(lock) as use:  # no timeout: waits for the timer's whole section
        assert time.monotonic() - t0 >= 0.45 and use.got and use.held and use.wait_s >= 0.45
    t.join(5)
    inside.clear(), release.clear()
    t = threading.Thread(target=timer)
    t.start()
    assert inside.wait(5)
    t0 = time.monotonic()
    with SharedUse(lock, timeout_s=0.1) as use:  # with a timeout: runs unlocked after it, and records that
        assert 0.08 <= time.monotonic() - t0 < 2.0 and not use.got
    release.set()
    t.join(5)
