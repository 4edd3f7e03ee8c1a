"""The timing-samples -> milestone mapping, on samples recorded by the sandbox on the 2-core CPU machine."""

import json
from pathlib import Path

import numpy as np
import pytest

from sandbox.result import SpeedUp
from sandbox.stats import bootstrap_speedup, distribution, milestone

REC = json.loads((Path(__file__).parent / "data" / "recorded_timings.json").read_text())["cases"]


def _level(eager, compiled, cand, **kw):
    se = bootstrap_speedup(eager, cand)
    sc = bootstrap_speedup(compiled, cand) if compiled is not None else None
    return milestone(se, sc, **kw)[0]


def test_recorded_fast_fused_kernel_is_faster_than_eager_only():
    c = REC["elementwise_chain/fast"]  # ~8x faster than eager, slower than torch.compile
    assert _level(c["eager"], c["compiled"], c["candidate"]) == 1


def test_recorded_slow_kernel_gets_zero():
    c = REC["elementwise_chain/slow"]  # ~9x slower than eager
    assert _level(c["eager"], c["compiled"], c["candidate"]) == 0


def test_recorded_fast_kernel_against_slow_baselines_reaches_the_top_milestone():
    fast, slow = REC["elementwise_chain/fast"], REC["elementwise_chain/slow"]
    # baselines taken from a recorded slow implementation: the candidate is ~70x faster than both
    assert _level(slow["candidate"], slow["candidate"][::-1], fast["candidate"]) == 3


@pytest.mark.parametrize("case", sorted(REC))
def test_identical_distributions_never_earn_a_milestone(case):
    e = REC[case]["eager"]
    assert _level(e, e, list(e)) == 0


@pytest.mark.parametrize("case", sorted(REC))
def test_three_percent_faster_in_the_noise_is_not_the_top_milestone(case):
    e = np.asarray(REC[case]["eager"])
    rng = np.random.default_rng(1)
    cand = e / 1.03 * rng.permutation(e) / np.median(e)  # 3% faster, with the recorded noise shuffled in
    assert _level(e, e, cand) < 3


def test_milestone_thresholds_are_configurable():
    se = SpeedUp(point=1.5, lo=1.3, hi=1.7, level=0.9)
    sc = SpeedUp(point=1.2, lo=1.1, hi=1.3, level=0.9)
    assert milestone(se, sc)[0] == 3
    assert milestone(se, sc, top_margin=1.2)[0] == 2
    assert milestone(se, sc, faster_than_compile=1.15)[0] == 1
    assert milestone(se, sc, faster_than_eager=1.4)[0] == 0
    assert milestone(se, None)[0] == 1


def test_bootstrap_interval_is_deterministic_and_contains_the_point():
    c = REC["reduction/fast"]
    a = bootstrap_speedup(c["eager"], c["candidate"], seed=3)
    b = bootstrap_speedup(c["eager"], c["candidate"], seed=3)
    assert a == b
    assert a.lo <= a.point <= a.hi
    wide = bootstrap_speedup(c["eager"][:5], c["candidate"][:5], seed=3, level=0.99)
    assert (wide.hi - wide.lo) >= (a.hi - a.lo) * 0.5


def test_distribution_and_input_checks():
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert d.median_ms == 2.5 and d.min_ms == 1.0 and d.reps == 4 and d.iqr_ms == pytest.approx(1.5)
    with pytest.raises(ValueError):
        distribution([])
    with pytest.raises(ValueError):
        bootstrap_speedup([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        bootstrap_speedup([1.0, 0.0], [1.0, 1.0])


def test_milestone_settled_only_when_no_threshold_lies_inside_an_interval():
    from sandbox.stats import milestone_settled

    def s(lo, hi):
        return SpeedUp(point=(lo + hi) / 2, lo=lo, hi=hi, level=0.99)

    assert milestone_settled(s(0.5, 0.9), None)  # clearly slower than eager: 0 whatever compile does
    assert milestone_settled(s(0.5, 0.9), s(2.0, 3.0))
    assert not milestone_settled(s(0.9, 1.1), None)  # straddles faster_than_eager
    assert milestone_settled(s(1.2, 1.4), None)  # 1, no compile baseline
    assert milestone_settled(s(1.2, 1.4), s(0.5, 0.8))  # 1
    assert not milestone_settled(s(1.2, 1.4), s(0.95, 1.02))  # 1 or 2
    assert milestone_settled(s(1.2, 1.4), s(1.1, 1.3))  # 3
    assert not milestone_settled(s(1.2, 1.4), s(1.01, 1.2))  # 2 or 3: top margin inside
    assert milestone_settled(s(1.01, 1.04), s(1.2, 1.3))  # 2: eager's upper bound below the margin
    # whenever settled, the level is the same for every pair of lower bounds within the intervals
    grid = [0.5, 0.9, 0.99, 1.0, 1.01, 1.04, 1.05, 1.06, 1.2, 2.0]
    for elo in grid:
        for ehi in grid:
            for c in [None] + [(a, b) for a in grid for b in grid if a <= b]:
                if ehi < elo:
                    continue
                e = s(elo, ehi)
                cs = s(*c) if c else None
                if milestone_settled(e, cs):
                    levels = {milestone(s(x, ehi), s(y, cs.hi) if cs else None)[0]
                              for x in grid if elo <= x <= ehi
                              for y in ([v for v in grid if cs.lo <= v <= cs.hi] if cs else [0.0])}
                    assert len(levels) == 1, (elo, ehi, c, levels)
