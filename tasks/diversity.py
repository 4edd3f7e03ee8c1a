"""Category and depth mix of a task set, and whether it meets the diversity goals.

Goals (issue: synthesis): at least 6 categories, none above 30% of the tasks, composition depths 2-5.
Depth is the number of operators (`len(task.operators)`, or metadata["depth"]).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from tasks.schema import Task


@dataclass
class DiversityReport:
    """Counts by category and by depth, and the checks against the goals."""

    n: int = 0
    categories: dict[str, int] = field(default_factory=dict)
    depths: dict[int, int] = field(default_factory=dict)
    min_categories: int = 6
    max_fraction: float = 0.30
    depth_range: tuple[int, int] = (2, 5)

    @property
    def largest_fraction(self) -> float:
        return max(self.categories.values()) / self.n if self.n else 0.0

    @property
    def problems(self) -> list[str]:
        out = []
        if len(self.categories) < self.min_categories:
            out.append(f"{len(self.categories)} categories (< {self.min_categories})")
        if self.n and self.largest_fraction > self.max_fraction:
            top = max(self.categories, key=self.categories.__getitem__)
            out.append(f"category {top} holds {self.largest_fraction:.0%} of the tasks (> {self.max_fraction:.0%})")
        lo, hi = self.depth_range
        missing = [d for d in range(lo, hi + 1) if d not in self.depths]
        if missing:
            out.append(f"no task of depth {missing}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self):
        """A rich Table of the mix."""
        from rich.table import Table

        t = Table(title=f"diversity of {self.n} task(s): " + ("ok" if self.ok else "; ".join(self.problems)))
        t.add_column("category")
        t.add_column("tasks", justify="right")
        t.add_column("share", justify="right")
        for c, k in sorted(self.categories.items(), key=lambda kv: -kv[1]):
            t.add_row(c, str(k), f"{k / self.n:.0%}")
        t.add_section()
        for d, k in sorted(self.depths.items()):
            t.add_row(f"depth {d}", str(k), f"{k / self.n:.0%}")
        return t


def depth_of(task: Task) -> int:
    return int(task.metadata.get("depth") or len(task.operators))


def diversity_report(tasks: Iterable[Task], min_categories: int = 6, max_fraction: float = 0.30) -> DiversityReport:
    tasks = list(tasks)
    return DiversityReport(
        n=len(tasks),
        categories=dict(Counter(t.category or "unknown" for t in tasks)),
        depths=dict(Counter(depth_of(t) for t in tasks)),
        min_categories=min_categories,
        max_fraction=max_fraction,
    )
