"""Loaders: KernelBench layout (fixture folder), .py file and folder, JSONL, Parquet; errors name the file."""

import json

import pytest

from tasks.analysis import analyze
from tasks.loaders import (LoaderError, load_jsonl, load_kernelbench, load_parquet, load_py_folder, load_tasks,
                           write_jsonl, write_parquet)
from tasks.validate import TaskValidationError

EXPECTED_KB = {
    "kb_l1_1_square_matrix_multiplication": ("matmul", 1),
    "kb_l1_19_relu": ("activation", 1),
    "kb_l1_23_softmax": ("softmax", 1),
    "kb_l1_40_layernorm": ("normalization", 1),
    "kb_l1_47_sum_reduction_over_a_dimension": ("reduction", 1),
    "kb_l2_1_conv2d_relu_biasadd": ("conv", 2),
    "kb_l2_12_gemm_multiply_leakyrelu": ("matmul", 2),
    "kb_l2_23_conv3d_groupnorm_mean": ("conv", 2),
    "kb_l3_1_mlp": ("matmul", 3),
}


def test_kernelbench_fixture_loads_and_runs(kb_fixture):
    tasks = load_tasks(kb_fixture)
    assert [t.id for t in tasks][:2] == ["kb_l1_1_square_matrix_multiplication", "kb_l1_19_relu"]
    assert {t.id for t in tasks} == set(EXPECTED_KB)
    for t in tasks:
        assert t.source == "kernelbench" and t.provenance["path"].endswith(".py")
        a = analyze(t)
        assert (a.category, a.level) == EXPECTED_KB[t.id], t.id
        assert a.metadata["output_shapes"] and a.metadata["flops"] >= 0
    conv = next(t for t in tasks if t.id == "kb_l2_1_conv2d_relu_biasadd")
    assert conv.shape_params == {"batch_size": 4, "in_channels": 3, "out_channels": 8, "height": 16, "width": 16,
                                 "kernel_size": 3}
    assert [t.level for t in load_kernelbench(kb_fixture, levels=[2])] == [2, 2, 2]


def test_kernelbench_layout_errors(tmp_path, good_source):
    with pytest.raises(LoaderError, match="not a KernelBench folder"):
        load_kernelbench(tmp_path)
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "relu.py").write_text(good_source)
    (tmp_path / "level1" / "3_Bad.py").write_text("import torch\n")
    with pytest.raises(LoaderError, match=r"relu.py: KernelBench file names read"):
        load_kernelbench(tmp_path)
    errors: list = []
    assert load_kernelbench(tmp_path, errors=errors) == []
    assert len(errors) == 2 and isinstance(errors[1], TaskValidationError)
    assert "3_Bad.py: no_model" in str(errors[1])


def test_py_file_and_folder(tmp_path, good_source):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text(good_source)
    (tmp_path / "sub" / "My Task.py").write_text(good_source.replace("dim = 32", "dim = 16"))
    (tmp_path / "__init__.py").write_text("")
    tasks = load_py_folder(tmp_path)
    assert [t.id for t in tasks] == ["a", "sub_my_task"]
    assert tasks[1].shape_params == {"batch_size": 4, "dim": 16} and tasks[1].source == "user"
    assert load_tasks(tmp_path / "a.py")[0].id == "a"
    (tmp_path / "broken.py").write_text(good_source.replace("def get_inputs", "def inputs"))
    with pytest.raises(TaskValidationError, match=r"broken.py: no_get_inputs"):
        load_tasks(tmp_path)
    with pytest.raises(LoaderError, match="no such file"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("")
    with pytest.raises(LoaderError, match="unknown task file type"):
        load_tasks(tmp_path / "x.csv")


def test_jsonl_roundtrip_and_line_errors(tmp_path, kb_fixture, good_source):
    tasks = [analyze(t) for t in load_tasks(kb_fixture)[:3]]
    p = tmp_path / "set.jsonl"
    assert write_jsonl(tasks, p) == 3
    back = load_jsonl(p)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in tasks]
    lines = p.read_text().splitlines()
    row = json.loads(lines[1])
    row["reference"] = row["reference"].replace("class Model", "class Other")
    p.write_text("\n".join([lines[0], json.dumps(row), "{not json", json.dumps({"id": "x"}), ""]) + "\n")
    with pytest.raises(TaskValidationError, match=r"set.jsonl:2 \(task kb_l1_19_relu\): no_model"):
        load_jsonl(p)
    errors: list = []
    assert [t.id for t in load_jsonl(p, errors=errors)] == [tasks[0].id]
    msgs = [str(e) for e in errors]
    assert "set.jsonl:3: not JSON" in msgs[1] and "set.jsonl:4: task record is missing required field 'name'" in msgs[2]


def test_kernelbench_dataset_rows_jsonl_and_parquet(tmp_path, good_source):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"code": good_source, "name": "19_ReLU", "problem_id": 19, "level": 1, "extra": "kept"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "kb.parquet")
    (tmp_path / "kb.jsonl").write_text(json.dumps(rows[0]) + "\n")
    for f in ("kb.parquet", "kb.jsonl"):
        (t,) = load_tasks(tmp_path / f)
        assert (t.id, t.name, t.source, t.level) == ("kb_l1_19_19_relu", "19_ReLU", "kernelbench", 1)
        assert t.metadata == {"extra": "kept"} and t.shape_params == {"batch_size": 4, "dim": 32}
    canonical = load_tasks(tmp_path / "kb.jsonl")
    assert write_parquet(canonical, tmp_path / "c.parquet") == 1
    assert [t.to_dict() for t in load_parquet(tmp_path / "c.parquet")] == [t.to_dict() for t in canonical]
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(LoaderError, match="junk.parquet: cannot read Parquet"):
        load_parquet(tmp_path / "junk.parquet")
