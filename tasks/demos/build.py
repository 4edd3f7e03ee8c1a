"""Build `tasks/builtin/demos.jsonl`: `python -m tasks.demos.build [--synthesized 12]`.

Takes every built-in single-operator task a generator covers, plus up to `--synthesized` covered tasks of
cpu_train and gpu_train (half each, spread over generator families and categories, lowest content hash
first), and writes all their demonstrations (cpu and cubin, two variants each). Eval splits are never used.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from tasks import builtin
from tasks.demos import Demo, demonstrations

OUT = builtin.HERE / "demos.jsonl"


def pick_synthesized(n: int) -> list:
    """Covered training tasks of the synthesized splits, spread over (family, category)."""
    chosen = []
    for split in ("cpu_train", "gpu_train"):
        want = n // 2 if split == "cpu_train" else n - n // 2
        covered = []
        for t in sorted(builtin.load_split(split), key=lambda t: t.content_hash):
            demos = demonstrations(t, formats=("cpu",))
            if demos:
                covered.append((demos[0].family, t.category, t))
        seen: Counter = Counter()
        picked = []
        while covered and len(picked) < want:  # round-robin over (family, category) pairs
            covered.sort(key=lambda x: (seen[(x[0], x[1])], seen[x[0]]))
            fam, cat, t = covered.pop(0)
            seen[(fam, cat)] += 1
            seen[fam] += 1
            picked.append(t)
        chosen += picked
    return chosen


def build(n_synth: int = 12) -> list[Demo]:
    tasks = [t for t in builtin.load_split("single_op") if demonstrations(t, formats=("cpu",))]
    tasks += pick_synthesized(n_synth)
    out: list[Demo] = []
    for t in tasks:
        out += demonstrations(t)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthesized", type=int, default=12)
    args = ap.parse_args(argv)
    demos = build(args.synthesized)
    OUT.write_text("".join(json.dumps(d.to_dict()) + "\n" for d in demos))
    tasks = {d.task_id for d in demos}
    print(f"{len(demos)} demonstrations for {len(tasks)} tasks -> {OUT}")
    print(dict(Counter(d.family for d in demos)))


if __name__ == "__main__":
    main()
