"""Session messages every service speaks: `Hello`, `Heartbeat`, `Error`.

A client may open with `Hello` and the service answers with its own; both carry the protocol version (the
header of every frame carries it too, so a peer of another version is refused message by message).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from protocol.codec import PROTOCOL_VERSION
from protocol.message import Message, check_float, check_int, check_plain_map, check_text, set_field

ROLES = ("learner", "actor", "sandbox", "client", "publisher", "tool")

#: Error codes. "busy": the service is at capacity, try another endpoint or after `retry_after_s`
#: (the backpressure reply of the sandbox node); "bad_message": the request failed decoding or validation
#: (`field` names the part); "version": other protocol version; "not_found": no such object (e.g. no
#: weights published yet); "gone": the object existed but was dropped (e.g. a retired weights version);
#: "internal": the handler failed.
ERROR_CODES = ("busy", "bad_message", "version", "not_found", "gone", "internal")


@dataclasses.dataclass(frozen=True, eq=False)
class Hello(Message):
    """Who is talking. Fields: role (one of ROLES), id (process id in the fleet, e.g. "actor-3"),
    protocol_version (int), capabilities (plain map, e.g. {"formats": ["cubin", "cpu"], "gpus": 8})."""

    TYPE: ClassVar[str] = "Hello"
    role: str
    id: str
    protocol_version: int = PROTOCOL_VERSION
    capabilities: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        t = self.TYPE
        check_text(t, "role", self.role, choices=ROLES)
        check_text(t, "id", self.id)
        check_int(t, "protocol_version", self.protocol_version, lo=0, hi=2**31)
        set_field(self, "capabilities", check_plain_map(t, "capabilities", self.capabilities))


@dataclasses.dataclass(frozen=True, eq=False)
class Heartbeat(Message):
    """Liveness ping; the service answers with a Heartbeat. Fields: id (sender), seq (counter), time_s
    (sender's clock, seconds since the epoch; informative only), status (plain map a service may add to its
    answers, e.g. the sandbox node's {"free": 3, "queued": 0, "running": 1, "workers": 4}; `free` is read by
    `protocol.rpc.RpcClient` to spread requests by free capacity)."""

    TYPE: ClassVar[str] = "Heartbeat"
    id: str
    seq: int = 0
    time_s: float = 0.0
    status: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        t = self.TYPE
        check_text(t, "id", self.id)
        set_field(self, "seq", check_int(t, "seq", self.seq, lo=0))
        set_field(self, "time_s", check_float(t, "time_s", self.time_s, lo=0.0))
        set_field(self, "status", check_plain_map(t, "status", self.status))


@dataclasses.dataclass(frozen=True, eq=False)
class Error(Message):
    """A refusal or failure. Fields: code (one of ERROR_CODES), message (human-readable), field (the
    offending field for "bad_message", else ""), request_id (the request it answers, e.g. a job or episode
    id, else ""), retry_after_s (for "busy": when trying again makes sense, seconds)."""

    TYPE: ClassVar[str] = "Error"
    code: str
    message: str = ""
    field: str = ""
    request_id: str = ""
    retry_after_s: float = 0.0

    def __post_init__(self) -> None:
        t = self.TYPE
        check_text(t, "code", self.code, choices=ERROR_CODES)
        check_text(t, "message", self.message, max_len=4096, empty=True)
        check_text(t, "field", self.field, max_len=512, empty=True)
        check_text(t, "request_id", self.request_id, empty=True)
        set_field(self, "retry_after_s", check_float(t, "retry_after_s", self.retry_after_s, lo=0.0))
