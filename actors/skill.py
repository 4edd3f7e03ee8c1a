"""The agent's skill text: the system prompt (workspace layout, rules, tools, the solution format of the backend
in use, the goal) and the first user message of an episode.

The rules restate the sandbox's contract (sandbox/FORMATS.md) in the words an agent needs; the sandbox enforces
them whatever the prompt says. Tools are described by JSON schemas inside the tool-call syntax of
`learner.chat` (`tools_system_prompt`), the one syntax the agent loop parses.
"""

from __future__ import annotations

from typing import Sequence

from learner.chat import format_tool_call, tools_system_prompt
from tasks.schema import Task

KERNEL_SUFFIXES = {
    "cubin": (".cu", ".cuh", ".h"),
    "cpu": (".c", ".cpp", ".cc", ".h", ".hpp"),
    "extension": (".cu", ".cuh", ".cpp", ".h"),
}
"""File suffixes allowed under kernels/ per solution format (sandbox/FORMATS.md)."""

MULTI_TURN_TOOLS = ("write_file", "read_file", "list_files", "compile", "verify", "profile", "finish")
SINGLE_TURN_TOOLS = ("write_file",)


def _schema(name: str, description: str, properties: dict | None = None, required: Sequence[str] = ()) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties or {}, "required": list(required)}}


def tool_schemas(fmt: str) -> dict[str, dict]:
    """JSON schemas of every tool, by name, for solution format `fmt`."""
    suffixes = ", ".join(KERNEL_SUFFIXES[fmt])
    return {
        "write_file": _schema(
            "write_file", f"Create or replace a file of your solution: model_new.py, or kernels/<name> with a suffix "
                          f"in ({suffixes}). The whole file text is replaced.",
            {"path": {"type": "string"}, "content": {"type": "string"}}, ("path", "content")),
        "read_file": _schema("read_file", "Read a workspace file (model.py, model_new.py or a file under kernels/).",
                             {"path": {"type": "string"}}, ("path",)),
        "list_files": _schema("list_files", "List the workspace's files with their sizes."),
        "compile": _schema("compile", "Run the static checks and build your kernels; returns the first compiler "
                                      "errors, if any."),
        "verify": _schema("verify", "Build, load ModelNew and compare it with Model on fresh random inputs; returns "
                                    "pass/fail and the largest error per trial."),
        "profile": _schema("profile", "Full evaluation: verify, then time your ModelNew against eager PyTorch and "
                                      "torch.compile; returns the times, the speed-ups and the reward level reached."),
        "finish": _schema("finish", "End the episode. Your workspace as it is now is evaluated in full and scored."),
    }


_FORMAT_TEXT = {
    "cpu": """\
# Solution format: cpu (host C/C++ kernels)
- Put kernels in kernels/*.c, kernels/*.cpp or kernels/*.cc (headers: kernels/*.h, kernels/*.hpp). They are built
  with `-O3 -march=native -fPIC -fopenmp -I kernels` into one shared library; OpenMP is allowed.
- Entry points: in C++ files `extern "C" void name(...)`; in C files every non-static top-level void function.
  Parameters: pointers to float, double, int, int64_t, uint8_t, ... (optionally const / __restrict__) and scalars
  of int, int64_t, long long, size_t, float, double, bool.
- The library may only call the C library's memory and math functions, the C++ runtime and OpenMP.
- `#include "cuda_agent.h"` (shipped by the sandbox) gives activations named after torch's (silu_f, gelu_erf_f,
  softplus_f, ...), AT(p, i) for a broadcast parameter (sandbox.runtime.bcast gives its count and inner), and
  vectorisable expf/logf/tanhf/...; sandbox.runtime.row_geometry gives (outer, cols, inner, out_shape) of a row op.
- In model_new.py:
  from sandbox.runtime import load_kernels
  K = load_kernels()
  ...
  out = torch.empty_like(x)
  K.my_kernel(x, out, x.numel())   # CPU tensors, contiguous, of the pointee's dtype; the call is synchronous
""",
    "cubin": """\
# Solution format: cubin (plain CUDA kernels)
- Put kernels in kernels/*.cu (headers: kernels/*.cuh, kernels/*.h). Each .cu file is built on its own with
  `nvcc -cubin -arch=<the GPU's> -O3 -std=c++17 -I kernels`. No torch, ATen, pybind11 or Python headers: plain
  CUDA C++ (math functions, cuda_fp16.h, cuda_bf16.h, cooperative groups, inline PTX are fine).
- `#include "cuda_agent.h"` (shipped by the sandbox) gives activations named after torch's (silu_f, gelu_erf_f,
  ...), AT(p, i) for a broadcast parameter (sandbox.runtime.bcast) and block_reduce(v, op) for block-wide sums.
- Entry points: `extern "C" __global__ void name(...)`, unique names across files. Parameters: pointers to float,
  double, __half, __nv_bfloat16, int, int64_t, uint8_t, ... (optionally const / __restrict__) and scalars of int,
  unsigned, int64_t, long long, size_t, float, double, bool.
- In model_new.py:
  from sandbox.runtime import load_kernels
  K = load_kernels()
  ...
  out = torch.empty_like(x)
  K.my_kernel(x, out, x.numel(), grid=((x.numel() + 255) // 256,), block=(256,), shared_mem=0)
  Tensors must be contiguous CUDA tensors of the pointee's dtype; launches run on torch's current stream.
""",
    "extension": """\
# Solution format: extension (torch C++/CUDA extension)
- Either kernels/*.cu plus exactly one kernels/<name>_binding.cpp defining
  PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", ...); }, loaded in model_new.py with
  from sandbox.runtime import load_extension; ext = load_extension()
- or model_new.py alone calling torch.utils.cpp_extension.load_inline(...) at import time.
- C++ may allocate tensors (torch::empty_like, ...) and launch its own kernels; torch compute ops called from C++
  are caught like Python ones. Builds take tens of seconds.
""",
}


SKILLS = ("full", "brief")


def brief_system_prompt(fmt: str, mode: str = "multi_turn") -> str:
    """A few lines of skill text (about 150 tokens) for small models trained from scratch, whose context is
    short and whose every prompt token costs: the same rules, tools and call syntax, without the long prose."""
    suffixes = "/".join(s.lstrip(".") for s in KERNEL_SUFFIXES[fmt])
    tools = ("write_file(path, content)" if mode == "single_turn" else
             "write_file(path, content), read_file(path), list_files(), compile(), verify(), profile(), finish()")
    how = ("One reply, no feedback: write every file now." if mode == "single_turn" else
           "Write, compile, verify, profile, improve, then finish.")
    return (f"Write model_new.py (class ModelNew: same constructor, inputs and outputs as Model in model.py) and "
            f"kernels/*.{{{suffixes}}} in the {fmt} format (load them with sandbox.runtime.load_kernels) so that it "
            f"computes what Model does, faster. Only model_new.py and kernels/ are writable; no torch compute in "
            f"forward. Tools: {tools}. Call one as {format_tool_call('name', {'argument': 'value'})}. {how} "
            f"Reward: -1 wrong, 0 correct, 1 faster than eager, 2 also faster than torch.compile, 3 at least 5% "
            f"faster than both.")


def system_prompt(fmt: str, mode: str = "multi_turn", max_turns: int = 0, skill: str = "full") -> str:
    """The system message of an episode for solution format `fmt` ("cubin" | "extension" | "cpu"), agent mode
    ("multi_turn" | "single_turn") and skill text ("full", or "brief": `brief_system_prompt`).
    Raises ValueError for an unknown format, mode or skill."""
    if fmt not in _FORMAT_TEXT:
        raise ValueError(f"unknown solution format {fmt!r} (expected one of {tuple(_FORMAT_TEXT)})")
    if mode not in ("multi_turn", "single_turn"):
        raise ValueError(f"unknown agent mode {mode!r}")
    if skill not in SKILLS:
        raise ValueError(f"unknown skill text {skill!r} (expected one of {SKILLS})")
    if skill == "brief":
        return brief_system_prompt(fmt, mode)
    suffixes = ", ".join(KERNEL_SUFFIXES[fmt])
    intro = f"""\
You are an expert performance engineer. You write custom kernels that replace a PyTorch model's computation and
run faster than both eager PyTorch and torch.compile, while computing the same results.

# Workspace
- model.py: the reference. `class Model(nn.Module)` with `get_inputs()` and `get_init_inputs()`. Read-only.
- model_new.py: your solution (you create it). `class ModelNew(torch.nn.Module)` takes the same constructor
  arguments as Model, and its forward takes the same inputs and returns the same outputs (shapes, dtypes).
  Name parameters and buffers as Model does: the reference's state_dict is loaded into ModelNew.
- kernels/: your kernel sources ({suffixes}).

# Rules (enforced by the checker, which you cannot change)
- You may write only model_new.py and files under kernels/. The reference, the tools and the checker are fixed.
- All computation happens in your kernels. Inside ModelNew.forward only allocation (torch.empty, empty_like,
  zeros, full, ...), views and metadata (view, reshape, permute, transpose, expand, contiguous, size, stride,
  indexing) and same-dtype copies may touch torch. Any torch compute op there (matmul, relu, sum, softmax,
  tensor arithmetic, ...) fails the solution as forbidden: no fallbacks to PyTorch.
- model_new.py may import only torch, torch.nn, torch.nn.functional, math, typing, dataclasses, functools,
  collections, os and sandbox.runtime. No try statements, exec, eval or subclassing of Model.
- Return fresh output tensors (never an input, never a view of one); every output element must be written by a
  kernel. Correctness is checked on several fresh random inputs, and timing synchronises fully, so work cannot
  hide from the clock.

{_FORMAT_TEXT[fmt]}
# Reward
-1 if it does not build or is wrong, 0 if correct, 1 if faster than eager PyTorch, 2 if also faster than
torch.compile, 3 if at least 5% faster than both. Aim for 3.
"""
    schemas = tool_schemas(fmt)
    if mode == "single_turn":
        how = ("# How to work\nYou have exactly one reply and no feedback. In it, write every file of your solution "
               "with write_file calls (model_new.py and your kernels). The workspace is then evaluated as it is.")
        return tools_system_prompt([schemas[t] for t in SINGLE_TURN_TOOLS], intro + "\n" + how)
    turns = f" You have at most {max_turns} replies." if max_turns else ""
    how = ("# How to work\nEach reply may reason briefly and then call one or more tools; their results come back "
           "in the next message. A good loop: write the files, compile, verify, profile, improve, and call finish "
           f"when you are done.{turns} When you finish, or run out of replies, context or time, the workspace is "
           "evaluated in full and that evaluation is your score.")
    return tools_system_prompt([schemas[t] for t in MULTI_TURN_TOOLS], intro + "\n" + how)


def task_prompt(task: Task, fmt: str, mode: str = "multi_turn") -> str:
    """The first user message: the task and its reference source."""
    end = ("Write model_new.py and your kernels now, in this one reply." if mode == "single_turn" else
           "Start by writing model_new.py and your kernels.")
    return (f"Task {task.id}: {task.name} (solution format: {fmt}).\n\nmodel.py:\n```python\n"
            f"{task.reference.rstrip()}\n```\n\n{end}")


def example_call(path: str = "model_new.py") -> str:
    """A write_file call in the one syntax (documentation and tests)."""
    return format_tool_call("write_file", {"path": path, "content": "..."})
