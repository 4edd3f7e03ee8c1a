"""Stages 1 (single-turn PPO) and 4 (multi-turn PPO): the learner service plus actor processes, supervised.

Wired to `cuda-agent learner` (learner/service.py) once it exists in the checkout; until then the stage is
recorded as "not_wired" in state.json and the report, and the run goes on with the next stage.
"""

from __future__ import annotations

import importlib.util


def learner_service_available() -> bool:
    return importlib.util.find_spec("learner.service") is not None


def run(driver, stage: str, st: dict) -> bool:
    """Run one PPO stage; returns whether the policy changed."""
    if not learner_service_available():
        st.update(status="not_wired", note="the learner service (learner/service.py, `cuda-agent learner`) is not "
                                           "in this checkout yet: PPO stages cannot run")
        driver.metrics.log("stage", stage, int(driver.state.get("global_step", 0)), event="not_wired")
        return False
    raise NotImplementedError("PPO stage wiring pending")
