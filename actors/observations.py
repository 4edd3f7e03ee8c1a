"""Concise observations from sandbox results, as the agent reads them after `compile`, `verify` and `profile`.

- compile: "ok", or the compiler output from the first error on (`compile_error_lines` lines), or the rule
  that was broken;
- verify: one line per trial, pass/fail with the largest absolute and relative error;
- profile: a small table of median times (eager, torch.compile, the solution) with speed-ups and their
  confidence intervals, and the reward level reached with the checker's reason.
Every observation is cut to `observation_max_chars`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sandbox.result import EvalResult, Status

_ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)


def clip(text: str, max_chars: int) -> str:
    """`text` cut to max_chars characters with a note saying how much was left out."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - 48)
    return text[:keep] + f"\n... [{len(text) - keep} more characters not shown]"


def first_errors(log: str, max_lines: int) -> str:
    """The compiler log from its first error line on, at most max_lines lines, with a count of the rest."""
    lines = log.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if _ERROR_LINE.search(line)), 0)
    start = max(0, start - 1) if start and lines[start - 1].rstrip().endswith(":") else start  # "In function ...:"
    kept = lines[start:start + max_lines]
    errors = sum(1 for line in lines if _ERROR_LINE.search(line))
    more = len(lines) - start - len(kept)
    tail = f"\n... [{more} more lines; {errors} error line(s) in all]" if more > 0 else ""
    return "\n".join(kept) + tail


def _num(x: Any) -> str:
    if not isinstance(x, (int, float)) or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.3g}"


def _failure(stage: str, res: EvalResult, error_lines: int) -> str:
    status = res.status
    head = f"{stage}: {status.upper()}: {res.message}".rstrip()
    if status == Status.COMPILE_ERROR.value and res.compile_log:
        return head + "\n" + first_errors(res.compile_log, error_lines)
    if status == Status.FORBIDDEN.value and res.violations:
        rows = [f"- {v.kind}: {v.detail}" for v in res.violations[:5]]
        if len(res.violations) > 5:
            rows.append(f"- ... {len(res.violations) - 5} more")
        return head + "\n" + "\n".join(rows)
    if status == Status.INCORRECT.value and res.trials:
        return head + "\n" + trial_lines(res)
    if status == Status.INTERNAL_ERROR.value:
        return head + "\n(the sandbox failed, not your solution; you may try again)"
    return head


def trial_lines(res: EvalResult) -> str:
    rows = []
    for t in res.trials:
        errs = f"max abs err {_num(t.max_abs_err)}, max rel err {_num(t.max_rel_err)}"
        if t.ok:
            rows.append(f"trial {t.index}: pass ({errs})")
        else:
            bad = f"{t.mismatched} of {t.numel} elements outside tolerance, " if t.numel else ""
            why = f": {t.message}" if t.message and not t.numel else ""
            rows.append(f"trial {t.index}: FAIL ({bad}{errs}){why}")
    return "\n".join(rows)


def compile_observation(res: EvalResult, error_lines: int = 12, max_chars: int = 3000) -> str:
    if not res.ok:
        return clip(_failure("compile", res, error_lines), max_chars)
    text = "compile: ok" + (" (unchanged sources: cached build)" if res.build_cached else "")
    if res.compile_log.strip():
        text += "\ncompiler output:\n" + first_errors(res.compile_log, error_lines)
    return clip(text, max_chars)


def verify_observation(res: EvalResult, error_lines: int = 12, max_chars: int = 3000) -> str:
    if not res.ok:
        return clip(_failure("verify", res, error_lines), max_chars)
    worst = max((t.max_abs_err for t in res.trials if isinstance(t.max_abs_err, float)
                 and not math.isnan(t.max_abs_err)), default=float("nan"))
    text = f"verify: PASS: correct on {len(res.trials)} of {len(res.trials)} trials (largest abs error {_num(worst)})"
    return clip(text + "\n" + trial_lines(res), max_chars)


REFUSED_FINISH = "finish: refused, the solution fails verification; fix it and call finish again."


def refused_finish_observation(verify_text: str, max_chars: int = 3000) -> str:
    """What the agent reads when AgentConfig.verify_on_finish refuses its finish: REFUSED_FINISH, then the verify
    observation of the workspace (`verify_observation`)."""
    return clip(REFUSED_FINISH + "\n" + verify_text, max_chars)


def profile_observation(res: EvalResult, error_lines: int = 12, max_chars: int = 3000) -> str:
    if not res.ok:
        return clip(_failure("profile", res, error_lines), max_chars)
    tm = res.timing
    if tm is None:
        return clip(f"profile: correct; not timed ({res.message}); reward {res.reward:g}", max_chars)
    rows = [f"profile: reward {res.reward:g}: {tm.milestone_reason or res.message}",
            f"{'':14s}{'median ms':>12s}{'IQR ms':>10s}",
            f"{'eager':14s}{tm.eager.median_ms:12.4g}{tm.eager.iqr_ms:10.3g}"]
    if tm.compiled is not None:
        rows.append(f"{'torch.compile':14s}{tm.compiled.median_ms:12.4g}{tm.compiled.iqr_ms:10.3g}")
    rows.append(f"{'yours':14s}{tm.candidate.median_ms:12.4g}{tm.candidate.iqr_ms:10.3g}")
    s = tm.speedup_eager
    rows.append(f"speed-up vs eager: {s.point:.3g}x [{s.lo:.3g}, {s.hi:.3g}] ({s.level:.0%} interval)")
    if tm.speedup_compile is not None:
        c = tm.speedup_compile
        rows.append(f"speed-up vs torch.compile: {c.point:.3g}x [{c.lo:.3g}, {c.hi:.3g}]")
    else:
        rows.append("torch.compile: not timed")
    if res.contended:
        rows.append("(timed while the device was shared: figures may be noisy)")
    return clip("\n".join(rows), max_chars)


def result_summary(res: EvalResult | None) -> dict[str, Any]:
    """A plain map of what decided a reward (for trajectories' reward_details and per-task result files)."""
    if res is None:
        return {"status": "not_evaluated"}
    out: dict[str, Any] = {"status": res.status, "reward": float(res.reward), "message": res.message[:500],
                           "contended": bool(res.contended)}
    if res.timing is not None:
        out["speedup_eager"] = float(res.timing.speedup_eager.point)
        out["milestone"] = int(res.timing.milestone)
        out["candidate_ms"] = float(res.timing.candidate.median_ms)
        out["eager_ms"] = float(res.timing.eager.median_ms)
        if res.timing.speedup_compile is not None:
            out["speedup_compile"] = float(res.timing.speedup_compile.point)
        if res.timing.compiled is not None:
            out["compile_ms"] = float(res.timing.compiled.median_ms)
    return out
