"""Typed configuration: dataclass schemas, YAML presets in `configs/`, and `a.b=value` overrides.

Each component owns one config dataclass (e.g. `sandbox.config.SandboxConfig`) that validates itself in
`__post_init__`. This module only merges sources in order (dataclass defaults < YAML file < dotlist
overrides) with OmegaConf and returns a real instance of the dataclass, so validation always runs.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override names an unknown field or holds a value of the wrong type."""


def load_config(schema: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Build a `schema` instance from its defaults, an optional YAML file and `key.sub=value` overrides.

    Raises:
      ConfigError: a missing or unreadable file, a file that is not a YAML mapping, an unknown key, a wrong type,
        or a malformed override; the message names the file or the override at fault.
      ValueError: from the dataclass's own validation (`__post_init__`).
    """
    merged = OmegaConf.structured(schema)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such config file")
        try:
            loaded = OmegaConf.load(p)
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{p}: not readable as YAML: {e}") from None
        if not isinstance(loaded, type(merged)):
            raise ConfigError(f"{p}: expected a YAML mapping at the top level")
        try:
            merged = OmegaConf.merge(merged, loaded)
        except OmegaConfBaseException as e:
            raise ConfigError(f"bad configuration in {p}: {e}") from None
    for item in overrides:  # one at a time, so the error names the override at fault
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
        except (OmegaConfBaseException, yaml.YAMLError) as e:
            raise ConfigError(f"bad override {item!r}: {e}") from None
    try:
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad configuration: {e}") from None


_OVERRIDE = re.compile(r"[A-Za-z_][\w.\[\]-]*=")


def config_path_and_overrides(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Split command-line arguments `[CONFIG.yaml] [key=value ...]`: the first is the config file unless it starts
    with a key and "=" (`a.b_c=...`: a key never holds "/"), so a run folder's path may hold "="
    (`runs/x=1/sandbox.yaml`); the rest are overrides. No file is looked at: a missing one is load_config's
    "no such config file"."""
    items = list(args)
    if items and not _OVERRIDE.match(items[0]):
        return items[0], items[1:]
    return None, items


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text (saved into each run folder)."""
    if not dataclasses.is_dataclass(cfg):
        raise TypeError(f"expected a config dataclass instance, got {type(cfg).__name__}")
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
