"""The candidate worker: the only process that imports and runs a solution's code.

Started by the trusted side (sandbox.reference_worker) as
`[unshare ...] python -m sandbox.candidate --fd-in N --fd-out M --device D --threads T`, ahead of time (a spare:
it imports torch, the slow part of a start, then waits). The first message, `setup` {workspace, format, jail,
env}, makes it confine itself (`sandbox.jail.enter`); `load` then installs the import hook (model_new.py may only
import the allow-listed modules, `sandbox.static_check.allowed_imports`) and only then imports the solution.
Each spare serves exactly one evaluation and is killed with its whole process tree afterwards.
It talks to the trusted side over two inherited pipes (`sandbox.wire`: msgpack, no pickle) and never sees a
seed, the reference's outputs or the reference module object; it sees only input tensors and weights.

Requests (map with "op") and replies:
  setup {workspace, format, jail, env}      -> {ok}   (first message only)
  load  {init_inputs, state_dict, fmt}      -> {ok, log} | {ok: False, status, error, violations}
  run   {inputs, poison}                    -> {ok, outputs, violations, alias, mutated} | error
  time  {calls, flush_bytes}                -> {ok, ms_per_call, violations} | error   (on the last run's inputs)
  last_outputs {}                           -> {ok, outputs}                             (of the last timed call)
  exit  {}                                  -> process exits
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
import traceback
from typing import Any

_MAX_TB = 3000


def _tb(ws: str) -> str:
    text = traceback.format_exc()
    text = text.replace(ws + "/", "")
    return text[-_MAX_TB:]


def _install_import_hook(allowed: set[str], violations: list[str]) -> None:
    orig = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        # PyImport_Import (imports made by C code, e.g. torch's dispatcher, while model_new's frame is current)
        # passes the current frame's globals and a *list* fromlist; import statements pass None or a tuple.
        c_level = isinstance(fromlist, list)
        if not c_level and globals is not None and globals.get("__name__") == "model_new":
            bad = level != 0 or name not in allowed
            if not bad and name == "sandbox":
                bad = any(f != "runtime" for f in (fromlist or ()))
            if bad:
                msg = f"model_new.py imports {'.' * level}{name} (not on the allow-list)"
                violations.append(msg)
                raise ImportError(msg)
        return orig(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded


def _tensors(v: Any) -> list:
    import torch

    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    return []


def _overlaps(a, b) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


class Worker:
    def __init__(self, ws: str, device: str, fmt: str):
        import torch

        self.torch = torch
        self.ws = ws
        self.device = device
        self.fmt = fmt
        self.model = None
        self.inputs: tuple = ()
        self.last_out: Any = None
        self.import_violations: list[str] = []
        self.cuda = device.startswith("cuda")
        self.flush = None
        self.io = os.path.join(ws, ".io")  # large tensors travel as files here (sandbox.wire spill)

    def _to_device(self, v: Any) -> Any:
        torch = self.torch
        if isinstance(v, torch.Tensor):
            return v.to(self.device)
        if isinstance(v, list):
            return [self._to_device(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self._to_device(x) for x in v)
        return v

    def _error(self, status: str, violations: list[str] | None = None) -> dict:
        err = _tb(self.ws)
        if self.cuda and ("CUDA error" in err or "illegal" in err or "launch failure" in err):
            status = "runtime_error"
        return {"ok": False, "status": status, "error": err, "violations": violations or []}

    def load(self, msg: dict) -> dict:
        from sandbox import wire
        from sandbox.static_check import allowed_imports

        _install_import_hook(allowed_imports(self.fmt), self.import_violations)
        try:
            import importlib

            mod = importlib.import_module("model_new")
        except BaseException:  # noqa: BLE001 - anything the candidate throws is its load error
            if self.import_violations:
                return self._error("forbidden", list(self.import_violations))
            return self._error("load_error")
        if not hasattr(mod, "ModelNew"):
            return {"ok": False, "status": "load_error", "error": "model_new.py defines no ModelNew", "violations": []}
        try:
            init_inputs = wire.decode_value(msg["init_inputs"], self.io)
            state = wire.decode_value(msg["state_dict"], self.io)
            model = mod.ModelNew(*init_inputs)
            if not isinstance(model, self.torch.nn.Module):
                return {"ok": False, "status": "load_error", "error": "ModelNew is not a torch.nn.Module",
                        "violations": []}
            res = model.load_state_dict(state, strict=False)
            model = model.to(self.device).eval()
        except BaseException:  # noqa: BLE001
            return self._error("load_error", list(self.import_violations))
        self.model = model
        log = []
        if res.missing_keys:
            log.append(f"ModelNew has parameters/buffers the reference lacks (kept their own values): {res.missing_keys[:8]}")
        if res.unexpected_keys:
            log.append(f"reference weights ModelNew did not take: {res.unexpected_keys[:8]}")
        if self.import_violations:
            return {"ok": False, "status": "forbidden", "error": "", "violations": list(self.import_violations)}
        return {"ok": True, "log": log}

    def _call(self, poison: bool) -> tuple[Any, list[str]]:
        from sandbox.guard import ComputeGuard

        torch = self.torch
        with torch.no_grad(), ComputeGuard(poison=poison) as g:
            try:
                out = self.model(*self.inputs)
            finally:
                viol = g.violations
        return out, viol

    def run(self, msg: dict) -> dict:
        from sandbox import wire

        torch = self.torch
        self.inputs = tuple(self._to_device(wire.decode_value(msg["inputs"], self.io)))
        before = [t.clone() for t in _tensors(self.inputs)]
        viol: list[str] = []
        try:
            out, viol = self._call(bool(msg.get("poison", True)))
            if self.cuda:
                torch.cuda.synchronize()
        except BaseException:  # noqa: BLE001
            from sandbox.guard import ForbiddenOpError

            exc = sys.exc_info()[1]
            if viol or isinstance(exc, ForbiddenOpError):
                return {"ok": False, "status": "forbidden", "error": str(exc), "violations": viol or [str(exc)]}
            return self._error("runtime_error")
        if viol or self.import_violations:
            return {"ok": False, "status": "forbidden", "error": "", "violations": viol + self.import_violations}
        outs = _tensors(out)
        ins = _tensors(self.inputs)
        alias = [f"output {i} shares memory with input {j}" for i, o in enumerate(outs) for j, t in enumerate(ins)
                 if _overlaps(o, t)]
        mutated = [f"input {j} was modified by forward" for j, (a, b) in enumerate(zip(ins, before))
                   if not (a.shape == b.shape and torch.equal(a, b))]
        try:
            enc = wire.encode_value(out, self.io)
        except (TypeError, RuntimeError) as e:
            return {"ok": False, "status": "runtime_error", "error": f"forward returned something that is not "
                                                                      f"tensors: {e}", "violations": []}
        return {"ok": True, "outputs": enc, "violations": [], "alias": alias, "mutated": mutated}

    def time(self, msg: dict) -> dict:
        from sandbox.timing import l2_flush_buffer, time_calls

        calls = int(msg["calls"])
        if self.cuda and self.flush is None:
            self.flush = l2_flush_buffer(int(msg.get("flush_bytes", 0)), self.device)
        holder: dict[str, Any] = {}

        def once() -> None:
            out, viol = self._call(False)
            holder["out"] = out
            if viol:
                holder.setdefault("viol", []).extend(viol)

        try:
            ms = time_calls(once, (), calls, self.cuda, self.flush)
        except BaseException:  # noqa: BLE001
            if holder.get("viol"):
                return {"ok": False, "status": "forbidden", "error": "", "violations": holder["viol"]}
            return self._error("runtime_error")
        self.last_out = holder.get("out")
        return {"ok": True, "ms_per_call": ms, "violations": holder.get("viol", [])}

    def last_outputs(self, msg: dict) -> dict:
        from sandbox import wire

        return {"ok": True, "outputs": wire.encode_value(self.last_out, self.io)}


def preload(threads: int) -> None:
    """Trusted preparation while no candidate code is around: import torch (the slow part of a start) and pay the
    first-dispatch-mode cost, so a worker can be started ahead (spare) or forked from a preloaded zygote."""
    import torch

    torch.set_num_threads(threads)
    from sandbox import wire  # noqa: F401
    from sandbox.guard import ComputeGuard

    # The first call under a TorchDispatchMode costs over a second (lazy imports in torch): pay it here.
    x = torch.zeros(8)
    with torch.no_grad(), ComputeGuard(poison=True):
        torch.empty_like(x).view(2, 4).t().contiguous().clone()
    del x


def serve(fd_in: int, fd_out: int, device: str, threads: int) -> None:
    """Wait for `setup`, confine, then answer requests until `exit` or EOF. Never returns."""
    import torch

    from sandbox import wire

    torch.set_num_threads(threads)
    try:
        setup = wire.recv(fd_in)
    except (wire.ChannelClosed, ValueError):
        os._exit(0)
    if not isinstance(setup, dict) or setup.get("op") != "setup":
        os._exit(2)
    if setup.get("jail"):
        from sandbox.jail import JailError, JailSpec, enter

        try:
            enter(JailSpec.from_json(setup["jail"]))
        except (JailError, OSError) as e:
            try:
                wire.send(fd_out, {"ok": False, "status": "internal_error", "error": f"confinement failed: {e}",
                                   "violations": []})
            finally:
                os._exit(125)
    elif setup.get("rlimits"):
        from sandbox.jail import set_rlimits

        set_rlimits(setup["rlimits"])
    for k, v in (setup.get("env") or {}).items():
        os.environ[str(k)] = str(v)
    ws = os.path.realpath(setup["workspace"])
    os.chdir(ws)
    sys.path.insert(0, ws)
    w = Worker(ws, device, setup.get("format", "cpu"))
    if w.cuda:
        torch.cuda.set_device(torch.device(device))
    wire.send(fd_out, {"ok": True})
    handlers = {"load": w.load, "run": w.run, "time": w.time, "last_outputs": w.last_outputs}
    while True:
        try:
            msg = wire.recv(fd_in)
        except (wire.ChannelClosed, ValueError):
            os._exit(0)
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "exit":
            os._exit(0)
        h = handlers.get(op)
        if h is None:
            reply = {"ok": False, "status": "internal_error", "error": f"unknown op {op!r}", "violations": []}
        else:
            try:
                reply = h(msg)
            except BaseException:  # noqa: BLE001
                reply = {"ok": False, "status": "internal_error", "error": _tb(ws), "violations": []}
        try:
            wire.send(fd_out, reply)
        except wire.ChannelClosed:
            os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd-in", type=int, required=True)
    ap.add_argument("--fd-out", type=int, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    preload(a.threads)
    serve(a.fd_in, a.fd_out, a.device, a.threads)


if __name__ == "__main__":
    main()
