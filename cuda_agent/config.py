"""Typed configuration: dataclass schemas, YAML presets in `configs/`, and `a.b=value` overrides.

Each component owns one config dataclass (e.g. `sandbox.config.SandboxConfig`) that validates itself in
`__post_init__`. This module only merges sources in order (dataclass defaults < YAML file < dotlist
overrides) with OmegaConf and returns a real instance of the dataclass, so validation always runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override names an unknown field or holds a value of the wrong type."""


def load_config(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Build a `schema` instance from its defaults, an optional YAML file and `key.sub=value` overrides.

    Raises:
      ConfigError: unknown key, wrong type, malformed override, or a file that is not a YAML mapping.
      ValueError: from the dataclass's own validation (`__post_init__`).
    """
    base = OmegaConf.structured(schema)
    layers: list[Any] = [base]
    try:
        if path is not None:
            loaded = OmegaConf.load(Path(path))
            if not isinstance(loaded, type(base)):
                raise ConfigError(f"{path}: expected a YAML mapping at the top level")
            layers.append(loaded)
        if overrides:
            for item in overrides:
                if "=" not in item:
                    raise ConfigError(f"override {item!r} is not of the form key=value")
            layers.append(OmegaConf.from_dotlist(list(overrides)))
        merged = OmegaConf.merge(*layers)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        where = f" in {path}" if path is not None else ""
        raise ConfigError(f"bad configuration{where}: {e}") from None


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text (saved into each run folder)."""
    if not dataclasses.is_dataclass(cfg):
        raise TypeError(f"expected a config dataclass instance, got {type(cfg).__name__}")
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
