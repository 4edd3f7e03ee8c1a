"""Base of every typed message, and the field checks its subclasses run in `__post_init__`.

A message is a frozen dataclass. Its fields are plain msgpack values (str, int, float, bool, tuples of them,
string-keyed maps of them) except the names listed in `ARRAYS`, which hold numpy arrays that travel in their
own ZeroMQ frames (see `protocol.codec`). Every check raises `ProtocolError` naming `<Type>.<field>`, whether
the message is built locally or decoded from the wire, so a bad message cannot exist in memory.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Iterable, Mapping, TypeVar

import numpy as np

from protocol.errors import ProtocolError

M = TypeVar("M", bound="Message")

#: Deepest nesting accepted in a plain map (a map inside a list inside a map ... counts each level).
MAX_PLAIN_DEPTH = 32
#: Largest int a msgpack field can hold (uint64 range; negative down to int64).
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


class Message:
    """Common wire behaviour of the typed messages (subclasses are frozen dataclasses).

    Class attributes:
      TYPE: the type name written in the header (e.g. "Trajectory").
      ARRAYS: names of the fields that are numpy arrays (each travels as raw bytes in its own frame(s)).
    """

    TYPE: ClassVar[str]
    ARRAYS: ClassVar[tuple[str, ...]] = ()

    def wire_body(self) -> dict[str, Any]:
        """The non-array fields as a msgpack-ready map (tuples pack as msgpack arrays)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.ARRAYS}  # type: ignore[arg-type]

    def wire_arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.ARRAYS}

    @classmethod
    def from_wire(cls: type[M], body: Any, arrays: Mapping[str, np.ndarray]) -> M:
        """Build from a decoded header body and the decoded arrays.

        Raises:
          ProtocolError: body is not a map, a field is unknown or missing, or a field fails its check.
        """
        if not isinstance(body, dict):
            raise ProtocolError(f"{cls.TYPE}", f"body must be a map, got {type(body).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for key in body:
            if key not in fields or key in cls.ARRAYS:
                raise ProtocolError(f"{cls.TYPE}.{key!s:.64}", "unknown field")
        for name, f in fields.items():
            if name in cls.ARRAYS:
                continue
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if name not in body and not has_default:
                raise ProtocolError(f"{cls.TYPE}.{name}", "missing required field")
        return cls(**body, **arrays)


def _err(owner: str, name: str, reason: str) -> ProtocolError:
    return ProtocolError(f"{owner}.{name}", reason)


def set_field(obj: Any, name: str, value: Any) -> None:
    """Store a normalised value on a frozen dataclass from its `__post_init__`."""
    object.__setattr__(obj, name, value)


def check_text(owner: str, name: str, value: Any, *, max_len: int = 256, empty: bool = False,
               choices: Iterable[str] | None = None) -> str:
    """A str of at most `max_len` characters; non-empty unless `empty`; one of `choices` when given."""
    if not isinstance(value, str):
        raise _err(owner, name, f"expected str, got {type(value).__name__}")
    if not empty and not value:
        raise _err(owner, name, "must not be empty")
    if len(value) > max_len:
        raise _err(owner, name, f"longer than {max_len} characters ({len(value)})")
    if choices is not None:
        allowed = tuple(choices)
        if value not in allowed:
            raise _err(owner, name, f"{value[:64]!r} is not one of {list(allowed)}")
    return value


def check_int(owner: str, name: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    """An int (numpy ints accepted, bool refused) within [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise _err(owner, name, f"expected int, got {type(value).__name__}")
    value = int(value)
    lo = _INT_MIN if lo is None else lo
    hi = _INT_MAX if hi is None else hi
    if not lo <= value <= hi:
        raise _err(owner, name, f"{value} is outside [{lo}, {hi}]")
    return value


def check_float(owner: str, name: str, value: Any, *, lo: float | None = None, finite: bool = True) -> float:
    """A float (ints accepted, bool refused), finite unless `finite=False`, >= lo when given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _err(owner, name, f"expected float, got {type(value).__name__}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise _err(owner, name, f"must be finite, got {value}")
    if lo is not None and not value >= lo:
        raise _err(owner, name, f"{value} is below {lo}")
    return value


def check_bool(owner: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise _err(owner, name, f"expected bool, got {type(value).__name__}")
    return bool(value)


def check_text_list(owner: str, name: str, value: Any, *, max_items: int = 1 << 20, max_len: int = 1024,
                    empty_items: bool = False) -> tuple[str, ...]:
    """A list or tuple of str; returned as a tuple."""
    if not isinstance(value, (list, tuple)):
        raise _err(owner, name, f"expected a list of str, got {type(value).__name__}")
    if len(value) > max_items:
        raise _err(owner, name, f"more than {max_items} items")
    return tuple(check_text(owner, f"{name}[{i}]", v, max_len=max_len, empty=empty_items) for i, v in enumerate(value))


def check_int_list(owner: str, name: str, value: Any, *, max_items: int = 1 << 20, lo: int | None = None,
                   hi: int | None = None) -> tuple[int, ...]:
    """A list or tuple of ints; returned as a tuple."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise _err(owner, name, f"expected a list of int, got {type(value).__name__}")
    if len(value) > max_items:
        raise _err(owner, name, f"more than {max_items} items")
    return tuple(check_int(owner, f"{name}[{i}]", v, lo=lo, hi=hi) for i, v in enumerate(value))


def check_plain_map(owner: str, name: str, value: Any, *, max_depth: int = MAX_PLAIN_DEPTH) -> dict[str, Any]:
    """A map with str keys whose values are plain msgpack values: None, bool, int, float, str, lists and
    str-keyed maps of those, nested at most `max_depth` deep. numpy scalars become Python scalars.

    Returns a normalised copy (tuples become lists), safe to pack.
    """
    if not isinstance(value, dict):
        raise _err(owner, name, f"expected a map, got {type(value).__name__}")
    return _plain(owner, name, value, max_depth)


def _plain(owner: str, path: str, value: Any, depth: int) -> Any:
    if depth < 0:
        raise _err(owner, path, "nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise _err(owner, path, "int out of the 64-bit range")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic) and isinstance(value, (np.bool_, np.integer, np.floating)):
        return _plain(owner, path, value.item(), depth)
    if isinstance(value, (list, tuple)):
        return [_plain(owner, f"{path}[{i}]", v, depth - 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _err(owner, path, f"map key {k!r:.64} is a {type(k).__name__}; keys must be str")
            out[k] = _plain(owner, f"{path}.{k:.64}", v, depth - 1)
        return out
    raise _err(owner, path, f"{type(value).__name__} is not a plain value (None/bool/int/float/str/list/map)")


def check_array(owner: str, name: str, value: Any, *, dtype: np.dtype | type, ndim: int | None = None) -> np.ndarray:
    """A numpy array of exactly `dtype` (lists and tuples are converted) with `ndim` dimensions when given.

    No silent casts: an ndarray of another dtype is refused, so int64 token ids are not truncated unnoticed.
    """
    want = np.dtype(dtype)
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value, dtype=want)
        except (TypeError, ValueError, OverflowError) as e:
            raise _err(owner, name, f"cannot be read as {want}: {e}") from None
    if not isinstance(value, np.ndarray):
        raise _err(owner, name, f"expected a numpy array, got {type(value).__name__}")
    if value.dtype != want:
        raise _err(owner, name, f"expected dtype {want}, got {value.dtype}")
    if ndim is not None and value.ndim != ndim:
        raise _err(owner, name, f"expected {ndim} dimension(s), got shape {value.shape}")
    return value
