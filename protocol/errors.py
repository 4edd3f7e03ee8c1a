"""The one exception type for bad protocol input."""

from __future__ import annotations


class ProtocolError(ValueError):
    """A message is malformed, truncated, oversized, of the wrong version, or has a field of the wrong type.

    Attributes:
      field: dotted name of the offending part, e.g. "Trajectory.loss_mask", "header.v", "frames".
      reason: what is wrong with it, in words.
      envelope: routing frames read before the problem (set by `protocol.sockets.recv_frames`, so a
        service can still address an Error reply to the sender); empty otherwise.
    """

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.envelope: list = []
