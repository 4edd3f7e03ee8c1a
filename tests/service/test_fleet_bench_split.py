"""benchmarks/fleet_bench.py's GPU-split buckets: which tasks fill the 1-10 ms and 10-100 ms buckets."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fleet_bench():
    spec = importlib.util.spec_from_file_location("fleet_bench", ROOT / "benchmarks" / "fleet_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REF = "import torch\nimport torch.nn as nn\nN = 4\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n" \
      "def get_inputs():\n    return [torch.randn(N)]\ndef get_init_inputs():\n    return []\n"


def _task(tid: str, eager_ms, source="measured", footprint=0) -> str:
    return json.dumps({"id": tid, "name": tid, "reference": REF, "shape_params": {"N": 4},
                       "metadata": {"eager_ms": eager_ms, "eager_ms_source": source, "footprint_bytes": footprint}})


def test_split_sets_take_measured_tasks_with_cubin_demos_smallest_first(tmp_path):
    fb = _fleet_bench()
    tasks = tmp_path / "split.jsonl"
    tasks.write_text("\n".join([
        _task("big", 5.0, footprint=10 << 30), _task("small", 2.0, footprint=1 << 30),
        _task("estimated", 3.0, source="estimate"),   # not measured on the GPU: left out
        _task("no_demo", 4.0), _task("slow_kernel", 40.0, footprint=2 << 30), _task("tiny", 0.5)]) + "\n")
    demos = tmp_path / "demos.jsonl"
    rows = [{"task_id": t, "format": "cubin", "variant": v, "files": {"model_new.py": f"# {t} {v}"}}
            for t in ("big", "small", "estimated", "slow_kernel", "tiny") for v in ("fused", "naive")]
    rows.append({"task_id": "no_demo", "format": "cpu", "variant": "fused", "files": {"model_new.py": "#"}})
    demos.write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    got = fb.split_sets([str(tasks)], str(demos), per_bucket=1)
    assert {k: [d["fast"].task["id"] for d in v] for k, v in got.items()} == \
        {"<1ms": ["tiny"], "1-10ms": ["small"], "10-100ms": ["slow_kernel"]}
    one = got["1-10ms"][0]
    assert one["fast"].files == {"model_new.py": "# small fused"} and one["slow"].files == {"model_new.py": "# small naive"}
    assert one["fast"].format == "cubin" and one["fast"].kind == "fast" and one["slow"].kind == "slow"
    two = fb.split_sets([str(tasks)], str(demos), per_bucket=2)
    assert [d["fast"].task["id"] for d in two["1-10ms"]] == ["small", "big"]


def test_builtin_gpu_split_fills_the_two_larger_buckets():
    fb = _fleet_bench()
    b = fb.BUILTIN
    got = fb.split_sets([f"{b}/gpu_train.jsonl", f"{b}/gpu_eval.jsonl"], f"{b}/demos.jsonl", per_bucket=1)
    assert set(got) >= {"1-10ms", "10-100ms"}, got.keys()
    for name, lo, hi in fb.BUCKETS:
        for sols in got.get(name, []):
            assert lo <= sols["fast"].task["metadata"]["eager_ms"] < hi
