"""Shared sandbox test setup: one long-lived CPU Evaluator for the whole session (torch.compile's first call in a
process costs 15-18 s on 2 cores; its trusted worker keeps each task's reference and compiled graph)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_testlib import cpu_config


@pytest.fixture(scope="session")
def sandbox_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sandbox")


@pytest.fixture(scope="session")
def cpu_evaluator(sandbox_tmp):
    from sandbox.evaluator import Evaluator

    ev = Evaluator(cpu_config(sandbox_tmp))
    yield ev
    ev.close()
