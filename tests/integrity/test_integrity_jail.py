"""What native code of a solution can open inside the candidate's jail (sandbox.jail, namespaces): the in-process
monitor sees no native I/O, so the trusted side's files must not be reachable at all from the candidate's mount
namespace. solutions/native_open_private.{py,c}: the kernel resolves libc's `open` in memory and tries the
workspace's reference copy, the task's pristine reference, the build cache and another job's workspace."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from integrity_lib import CORPUS, adversarial, task
from sandbox.jail import probe

pytestmark = pytest.mark.skipif(not probe(65534)[0], reason="namespace isolation unavailable (needs root and "
                                                            "unshare): only the jail keeps native code out")


@pytest.fixture()
def other_workspace(hack_evaluator):
    """A sibling of the job's workspace, laid out as another job's (owned by the sandbox uid, as the evaluator's are)."""
    root = hack_evaluator.cfg.workspaces_dir
    root.mkdir(parents=True, exist_ok=True)
    d = root / f"ws-{secrets.token_hex(16)}"
    d.mkdir(mode=0o700)
    f = d / "model_new.py"
    f.write_text("# another job's solution\n")
    uid = hack_evaluator.jail_uid or -1
    if uid > 0:
        os.chown(d, uid, uid)
        os.chown(f, uid, uid)
    yield f
    shutil.rmtree(d, ignore_errors=True)


def _files(private: dict[str, str]) -> dict[str, str]:
    files = adversarial("native_open_private")
    src = files["kernels/native_open_private.c"]
    for k, v in private.items():
        assert f'"@{k}@"' in src
        src = src.replace(f'"@{k}@"', '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return {**files, "kernels/native_open_private.c": src}


def _private(ev, other: Path) -> dict[str, str]:
    cache = Path(ev.cfg.cache_dir) / "builds"  # every job's builds (this job's own is stored there before it runs)
    cache.mkdir(parents=True, exist_ok=True)
    pristine = CORPUS / "elementwise_chain" / "model.py"
    assert pristine.is_file()
    return {"PRISTINE": str(pristine), "CACHE": str(cache), "OTHER_WS": str(other)}


def test_native_code_cannot_open_the_trusted_sides_files(hack_evaluator, other_workspace):
    assert hack_evaluator.isolation_mode == "namespaces"
    res = hack_evaluator.evaluate(task(), _files(_private(hack_evaluator, other_workspace)), "cpu")
    # ok: its own model_new.py opened (the resolver works) and none of the four private paths did
    assert res.status == "ok" and res.reward >= 0, res.message


def test_the_native_probe_sees_a_readable_path(hack_evaluator, other_workspace):
    """The probe is not vacuous: a path it can open (its own file, in place of the pristine reference) makes the
    output wrong by 1000 + 4 (bit 2: PRIVATE[1] opened)."""
    paths = {**_private(hack_evaluator, other_workspace), "PRISTINE": "model_new.py"}
    res = hack_evaluator.evaluate(task(), _files(paths), "cpu")
    assert res.status == "incorrect" and res.reward == -1, res.message
    assert "max abs error 100" in res.message, res.message
