"""One long-lived CPU Evaluator for the integrity tests (static checks off, so the runtime defences are what
catches each hack; torch.compile off: no class here depends on it)."""

from __future__ import annotations

import pytest

from integrity_lib import cpu_config


@pytest.fixture(scope="session")
def hack_evaluator(tmp_path_factory):
    from sandbox.evaluator import Evaluator

    ev = Evaluator(cpu_config(tmp_path_factory.mktemp("integrity")))
    yield ev
    ev.close()
