"""Timing statistics and the milestone reward: pure functions of recorded samples (unit-tested on them).

Speed-up = median(baseline per-call times) / median(candidate per-call times). Its confidence interval is a
paired percentile bootstrap over the interleaved repetitions: repetition r timed eager, torch.compile and the
candidate back to back (in rotating order), so resampling whole repetitions keeps drift (clocks, temperature,
other load) common to the three and out of the ratio (Efron & Tibshirani, An Introduction to the Bootstrap,
1993, ch. 13).

Milestone reward (CUDA Agent, arXiv 2602.24286; DESIGN.md), with a "faster" claim only when the interval's lower
bound clears the threshold, since the 5% margin of the top level is of the order of timing noise:
  -1 failure (not decided here); 0 correct;
  1 lower bound of speed-up over eager > faster_than_eager;
  2 and lower bound over torch.compile > faster_than_compile;
  3 and both lower bounds >= top_margin (default 1.05: at least 5% faster than both).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sandbox.result import Distribution, SpeedUp


def distribution(samples_ms: Sequence[float]) -> Distribution:
    """Summary of per-call times (ms). Raises ValueError for an empty sequence."""
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no timing samples")
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return Distribution(median_ms=float(q50), iqr_ms=float(q75 - q25), min_ms=float(a.min()), mean_ms=float(a.mean()),
                        reps=int(a.size), samples_ms=[float(x) for x in a])


def bootstrap_speedup(baseline_ms: Sequence[float], candidate_ms: Sequence[float], samples: int = 2000,
                      level: float = 0.90, seed: int = 0) -> SpeedUp:
    """Paired percentile-bootstrap interval of median(baseline) / median(candidate).

    Args:
      baseline_ms, candidate_ms: per-call times of the same repetitions ([reps] each, paired by index).
      samples: bootstrap resamples. level: two-sided confidence level. seed: resampling seed (deterministic).
    Raises: ValueError when the lengths differ or are zero, or a time is not positive.
    """
    b = np.asarray(baseline_ms, dtype=np.float64)
    c = np.asarray(candidate_ms, dtype=np.float64)
    if b.size == 0 or b.size != c.size:
        raise ValueError(f"paired samples needed, got {b.size} baseline and {c.size} candidate")
    if (b <= 0).any() or (c <= 0).any():
        raise ValueError("timing samples must be positive")
    point = float(np.median(b) / np.median(c))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, b.size, size=(samples, b.size))
    ratios = np.median(b[idx], axis=1) / np.median(c[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [alpha, 1.0 - alpha])
    return SpeedUp(point=point, lo=float(lo), hi=float(hi), level=level)


def milestone_settled(speedup_eager: SpeedUp, speedup_compile: SpeedUp | None, faster_than_eager: float = 1.0,
                      faster_than_compile: float = 1.0, top_margin: float = 1.05) -> bool:
    """Whether `milestone` would give the same level for any lower bound within these intervals: every threshold
    that decides the level lies outside its interval. Used with wider intervals than the reward's
    (SandboxConfig.early_stop_level) to end a profile early, so that optional stopping costs little: a level is
    given only on the final intervals at SandboxConfig.ci_level, which the wider ones contain."""
    e, c = speedup_eager, speedup_compile
    if e.hi < faster_than_eager:
        return True  # 0: not faster than eager
    if not e.lo > faster_than_eager:
        return False
    if c is None or c.hi < faster_than_compile:
        return True  # 1
    if not c.lo > faster_than_compile:
        return False
    return (e.lo >= top_margin and c.lo >= top_margin) or e.hi < top_margin or c.hi < top_margin  # 3, or 2


def milestone(speedup_eager: SpeedUp, speedup_compile: SpeedUp | None, faster_than_eager: float = 1.0,
              faster_than_compile: float = 1.0, top_margin: float = 1.05) -> tuple[int, str]:
    """Milestone level (0-3) of a correct solution and a sentence that says why (see module doc)."""
    e = speedup_eager
    if not e.lo > faster_than_eager:
        return 0, (f"not shown faster than eager: speed-up {e.point:.3f}x, {e.level:.0%} interval "
                   f"[{e.lo:.3f}, {e.hi:.3f}] does not clear {faster_than_eager:g}")
    if speedup_compile is None:
        return 1, f"faster than eager (lower bound {e.lo:.3f} > {faster_than_eager:g}); torch.compile not timed"
    c = speedup_compile
    if not c.lo > faster_than_compile:
        return 1, (f"faster than eager (lower bound {e.lo:.3f}), not shown faster than torch.compile: "
                   f"{c.point:.3f}x [{c.lo:.3f}, {c.hi:.3f}]")
    if e.lo >= top_margin and c.lo >= top_margin:
        return 3, (f"at least {top_margin:g}x faster than eager and torch.compile (lower bounds {e.lo:.3f}, "
                   f"{c.lo:.3f})")
    return 2, (f"faster than eager and torch.compile (lower bounds {e.lo:.3f}, {c.lo:.3f}), below the "
               f"{top_margin:g}x margin on at least one")
