"""Where a run's held-out solutions go wrong: each evaluation episode's files diffed against the demonstration
generator's compact solution for the same task (tasks.demos.compact), with the sandbox's status and message.

    python scripts/eval_diff.py runs/<run>/episodes/eval-after_warm_start.jsonl [--split cpu_family_eval]

For analysis only: the generator's solutions of evaluation tasks are never training data (the split check in
cuda_agent.corpus keeps them out). Tasks the generator does not cover are listed without a diff.
"""

from __future__ import annotations

import argparse
import difflib
import json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("episodes", help="an episodes JSONL of a run (runs/<run>/episodes/eval-*.jsonl)")
    p.add_argument("--split", default="cpu_family_eval", help="the built-in split the tasks come from")
    p.add_argument("--format", default="cpu")
    args = p.parse_args()

    from tasks.builtin import load_split
    from tasks.demos import demonstrations

    tasks = {t.id: t for t in load_split(args.split)}
    for line in open(args.episodes):
        ep = json.loads(line)
        final = ep.get("final") or {}
        print("=" * 20, ep["task_id"], final.get("status", ep.get("status")),
              final.get("message", "")[:300].replace("\n", " | "))
        task = tasks.get(ep["task_id"])
        ref = [d for d in demonstrations(task, (args.format,)) if d.variant == "compact"] if task else []
        if not ref:
            print("(no generated solution for this task)")
            continue
        for path, text in ref[0].files.items():
            got = ep.get("files", {}).get(path, "")
            diff = list(difflib.unified_diff(text.splitlines(), got.splitlines(), "reference/" + path,
                                              "sampled/" + path, n=0, lineterm=""))
            if diff:
                print("\n".join(diff))


if __name__ == "__main__":
    main()
