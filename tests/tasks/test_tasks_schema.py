"""Task record, static and runtime validation: each problem is named together with the file."""

import pytest

from tasks import reference as ref
from tasks.schema import Task
from tasks.validate import TaskValidationError, check_runtime, check_static, validate_task


def test_record_roundtrip_and_field_errors(good_source):
    t = Task(id="a", name="A", reference=good_source, shape_params={"dim": 32}, provenance={"path": "x.py"})
    assert Task.from_dict(t.to_dict()) == t
    assert len(t.content_hash) == 64
    with pytest.raises(ValueError, match="unknown field"):
        Task.from_dict({**t.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="missing required field 'reference'"):
        Task.from_dict({"id": "a", "name": "A"})
    with pytest.raises(ValueError, match="source must be one of"):
        Task(id="a", name="A", reference="x", source="elsewhere")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape_params must map names to ints"):
        Task(id="a", name="A", reference="x", shape_params={"n": 2.5})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda s: s.replace("def forward(self, x):", "def forward(self, x)"), "syntax_error"),
        (lambda s: s.replace("class Model(", "class Net("), "no_model"),
        (lambda s: s.replace("def get_inputs()", "def make_inputs()"), "no_get_inputs"),
        (lambda s: s.replace("def get_init_inputs()", "def init_args()"), "no_get_init_inputs"),
    ],
)
def test_static_problems_name_file_and_problem(good_source, mutate, problem):
    with pytest.raises(TaskValidationError) as ei:
        check_static(mutate(good_source), "some/dir/task_7.py")
    assert ei.value.problem == problem
    assert str(ei.value).startswith(f"some/dir/task_7.py: {problem}")


@pytest.mark.parametrize(
    "mutate, problem, detail",
    [
        (lambda s: "import not_a_real_module_xyz\n" + s, "import_error", "ModuleNotFoundError"),
        (lambda s: s.replace("class Model(nn.Module):", "class Model:"), "model_not_module", ""),
        (lambda s: s.replace("return [dim]", "return [dim, dim, dim]"), "init_error", "TypeError"),
        (lambda s: s.replace("torch.randn(batch_size, dim)", "torch.randn(batch_size, dim + 1)"),
         "forward_error", "line 14: return torch.relu(self.linear(x))"),
        (lambda s: s.replace("return torch.relu(self.linear(x))", "return float(x.sum())"),
         "non_tensor_output", "float"),
        (lambda s: s.replace("return torch.relu(self.linear(x))", "return (x, [1, 2])"),
         "non_tensor_output", "int"),
        (lambda s: s.replace("return [torch.randn(batch_size, dim)]", "return torch.randn(batch_size, dim)"),
         "inputs_error", "Tensor"),
        (lambda s: s.replace("batch_size = 4", "batch_size = 4\n_calls = []").replace(
            "return torch.relu(self.linear(x))", "_calls.append(1)\n        return x * len(_calls)"),
         "not_deterministic", "max abs difference"),
    ],
)
def test_runtime_problems(good_source, mutate, problem, detail):
    with pytest.raises(TaskValidationError) as ei:
        check_runtime(mutate(good_source), "user/task.py")
    assert ei.value.problem == problem, str(ei.value)
    assert str(ei.value).startswith("user/task.py: " + problem)
    assert detail in str(ei.value)


def test_runtime_info_and_tuple_outputs(good_source):
    info = check_runtime(good_source, "ok.py")
    assert info.input_shapes == [[4, 32]] and info.output_shapes == [[4, 32]] and info.output_dtypes == ["float32"]
    two = good_source.replace("return torch.relu(self.linear(x))", "y = self.linear(x)\n        return y, {'s': y.sum(1)}")
    assert check_runtime(two, "two.py").output_shapes == [[4, 32], [4]]


def test_shape_params_read_and_rewrite(good_source):
    src = good_source.replace("dim = 32", "dim = 32  # features\nh, w = 8, -2\nflag = True\nscale = 2.0")
    assert ref.shape_params(src) == {"batch_size": 4, "dim": 32, "h": 8, "w": -2}
    out = ref.with_shape_params(src, {"dim": 64, "w": 3})
    assert ref.shape_params(out) == {"batch_size": 4, "dim": 64, "h": 8, "w": 3}
    assert "dim = 64  # features" in out and "flag = True" in out
    with pytest.raises(KeyError, match="scale"):
        ref.with_shape_params(src, {"scale": 3})
    with pytest.raises(ValueError, match="must be an int"):
        ref.with_shape_params(src, {"dim": 3.5})
    # The rewritten source runs at the new size.
    assert check_runtime(ref.with_shape_params(good_source, {"dim": 48}), "r.py").output_shapes == [[4, 48]]


def test_validate_task_checks_declared_shape_params(good_source):
    t = Task(id="t", name="t", reference=good_source, shape_params={"dim": 32, "nope": 1},
             provenance={"path": "lib/t.py"})
    with pytest.raises(TaskValidationError, match=r"lib/t.py: bad_shape_params.*nope"):
        validate_task(t, runtime=False)
    assert validate_task(t.replace(shape_params={"dim": 32}), runtime=True).output_shapes == [[4, 32]]
