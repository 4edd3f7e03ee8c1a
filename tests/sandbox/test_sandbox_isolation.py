"""The candidate's confinement, proven with real processes: writes outside the workspace and sockets fail,
escaped process groups die with the namespace, and the result records what was active."""

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from sandbox.jail import JailSpec, command_prefix, default_expose, describe, probe

pytestmark = pytest.mark.skipif(not probe(65534)[0], reason="namespace isolation unavailable (needs root, unshare)")


def _run_jailed(tmp_path, code: str, timeout=60):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model.py").write_text("reference")
    os.chown(ws, 65534, 65534)
    spec = JailSpec(workspace=str(ws), readonly=[str(ws / "model.py")], uid=65534, expose=default_expose(),
                    rlimits={"nproc": 64, "fsize_bytes": 1 << 20})
    prog = "import sys\nfrom sandbox.jail import JailSpec, enter\nenter(JailSpec.from_json(sys.argv[1]))\n" + \
        textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.run(command_prefix() + [sys.executable, "-c", prog, spec.to_json()], capture_output=True,
                          text=True, timeout=timeout, cwd=ws, env=env), ws


def test_writes_outside_workspace_and_sockets_fail(tmp_path):
    outside = tmp_path / "outside.txt"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    p, ws = _run_jailed(tmp_path, f"""
        import os, socket
        open("inside.txt", "w").write("ok")
        for path in [{str(outside)!r}, "/tmp/sandbox-escape-test", "model.py", "/dev/shm/escape"]:
            try:
                open(path, "w").write("x"); print("WROTE", path)
            except OSError as e:
                print("blocked", path, e.errno)
        for addr in [("127.0.0.1", {port}), ("1.1.1.1", 80)]:
            try:
                socket.create_connection(addr, timeout=2); print("CONNECTED", addr)
            except OSError as e:
                print("noconnect", addr)
        print("uid", os.getuid())
    """)
    srv.close()
    assert p.returncode == 0, p.stderr
    assert "WROTE" not in p.stdout and "CONNECTED" not in p.stdout
    assert p.stdout.count("blocked") == 4 and p.stdout.count("noconnect") == 2
    assert "uid 65534" in p.stdout
    assert (ws / "inside.txt").read_text() == "ok"
    assert not outside.exists() and (ws / "model.py").read_text() == "reference"


def test_setsid_escape_dies_with_the_namespace(tmp_path):
    marker = tmp_path / "ws" / "alive"
    p, _ = _run_jailed(tmp_path, f"""
        import os, subprocess, sys
        # a grandchild in its own session, trying to outlive the evaluation
        subprocess.Popen([sys.executable, "-c", "import time, os\\nwhile True:\\n    open({str(marker)!r}, 'a').write('x')\\n    time.sleep(0.05)"],
                         start_new_session=True)
        print("spawned")
    """)
    assert "spawned" in p.stdout
    time.sleep(0.5)
    size = marker.stat().st_size if marker.exists() else 0
    time.sleep(0.5)
    assert (marker.stat().st_size if marker.exists() else 0) == size, "escaped process still running"


def test_fork_bomb_is_bounded_by_nproc(tmp_path):
    p, _ = _run_jailed(tmp_path, """
        import os
        n = 0
        try:
            for _ in range(500):
                if os.fork() == 0:
                    import time; time.sleep(5); os._exit(0)
                n += 1
        except OSError as e:
            print("fork refused after", n)
    """)
    assert "fork refused after" in p.stdout, p.stdout + p.stderr


def test_describe_records_the_active_isolation():
    d = describe("namespaces", JailSpec(workspace="/x", uid=65534, rlimits={"nproc": 64}))
    assert d["mode"] == "namespaces" and "net" in d["namespaces"] and d["readonly_root"] and d["uid"] == 65534
    assert describe("none", None)["mode"] == "none"
