"""One episode of the agent loop (ReAct, multi-turn) or of single-turn generation, and its trajectory.

    system: skill text (actors.skill)        user: the task and model.py
    loop:   assistant turn (sampled, kept verbatim with behaviour log-probs, loss mask 1)
            -> tool calls parsed strictly (learner.chat) and run: write_file / read_file / list_files locally,
               compile / verify / profile on the sandbox nodes (actors.sandbox_stages)
            -> tool results as `tool` messages (freshly tokenized, loss mask 0)
    end:    finish, max turns, context exhausted, wall-clock budget, or a fatal error (with
            AgentConfig.verify_on_finish, a finish whose verification fails is refused while turns remain);
            then the final workspace is evaluated in full and its milestone reward is the episode's reward
            ("best" option: the best of that and every full evaluation seen).

Statuses: finished (the agent called finish; single-turn: its one reply), max_turns, context_exhausted,
time_limit; and two that are not trained on (the reward would be meaningless): sandbox_error (no sandbox
answer, or the sandbox failed internally on the final evaluation) and policy_error (the policy call failed).

Context accounting: before each turn, the room left is max_context_tokens - context length; with less than
min_new_tokens_per_turn the episode ends `context_exhausted`; a turn may sample min(max_new_tokens_per_turn,
room) tokens, and a turn cut by the room (not by the per-turn limit) is dropped, so no truncated assistant turn
enters the trajectory.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from actors.config import AgentConfig
from actors.observations import (clip, compile_observation, profile_observation, refused_finish_observation,
                                 result_summary, verify_observation)
from actors.sandbox_stages import SandboxStages, SandboxUnavailable
from actors.skill import MULTI_TURN_TOOLS, SINGLE_TURN_TOOLS, system_prompt, task_prompt
from actors.workspace import ENTRY, AgentWorkspace, WorkspaceRuleError
from learner.chat import (ChatFormat, ChatTokens, Message, ToolCall, ToolCallError, neutralise_special_tokens,
                          parse_tool_calls)
from protocol.trajectory import Trajectory
from sandbox.result import EvalResult, Status
from tasks.schema import Task

TRAINABLE = ("finished", "max_turns", "context_exhausted", "time_limit")
NOT_TRAINABLE = ("sandbox_error", "policy_error")

_TOOL_ARGS: dict[str, dict[str, type]] = {
    "write_file": {"path": str, "content": str}, "read_file": {"path": str}, "list_files": {}, "compile": {},
    "verify": {}, "profile": {}, "finish": {},
}


def _neutralised(observations: list[Message]) -> list[Message]:
    """Tool output may quote the policy's own text (a compile log, read_file): never a special token in it."""
    return [Message(m.role, neutralise_special_tokens(m.content)) for m in observations]


@dataclasses.dataclass
class Episode:
    """A finished (or ended) episode: the token record, what happened, and the reward.

    tokens, loss_mask, logprobs: `[T]` int32 / uint8 / float32 (`learner.chat.ChatTokens`, without a trailing
    generation prompt); turn_starts: offset of each assistant turn's first sampled token.
    """

    episode_id: str
    task: Task
    fmt: str
    mode: str
    policy_name: str
    policy_version: int
    messages: list[Message]
    tokens: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    turn_starts: list[int]
    status: str
    reward: float
    reward_source: str
    final: EvalResult | None
    files: dict[str, str]
    tool_log: list[dict[str, Any]]
    stats: dict[str, Any]
    error: str = ""

    @property
    def trainable(self) -> bool:
        return self.status in TRAINABLE

    def reward_details(self) -> dict[str, Any]:
        """result_summary of the final evaluation, the reward and its source, the episode status, and for a final
        result that is not ok "observation": its verify observation (the text the `verify` tool shows; RFT's repair
        sequences quote it: learner.stages.repair_pairs)."""
        out = {**result_summary(self.final), "reward": float(self.reward), "reward_source": self.reward_source,
               "episode_status": self.status}
        if self.final is not None and not self.final.ok:
            out["observation"] = verify_observation(self.final)
        return out

    def trajectory(self, actor_id: str) -> Trajectory:
        """The protocol message the learner trains on (raises ProtocolError if a field is malformed)."""
        return Trajectory(episode_id=self.episode_id, task_id=self.task.id, actor_id=actor_id,
                          policy_version=max(0, self.policy_version), tokens=self.tokens.astype(np.int32),
                          behaviour_logprobs=self.logprobs.astype(np.float32),
                          loss_mask=self.loss_mask.astype(np.uint8),
                          turn_boundaries=np.asarray(self.turn_starts, np.int32), reward=float(self.reward),
                          reward_details=self.reward_details(),
                          episode_stats={**self.stats, "status": self.status, "tools": self.tool_log,
                                         "error": self.error[:2000]})

    def result_row(self) -> dict[str, Any]:
        """Per-task result (evaluation mode): plain JSON-able map."""
        return {"task_id": self.task.id, "task_name": self.task.name, "episode_id": self.episode_id,
                "level": self.task.level,
                "policy": self.policy_name, "policy_version": self.policy_version, "mode": self.mode,
                "format": self.fmt, "status": self.status, "reward": float(self.reward),
                "reward_source": self.reward_source, "final": result_summary(self.final), "error": self.error,
                "stats": self.stats, "tools": self.tool_log, "files": self.files}


@dataclasses.dataclass
class EpisodeContext:
    """What every episode of an actor shares: chat format, agent config, solution format, the batcher
    (actors.batcher.GenerationBatcher) and the sandbox stages."""

    chat: ChatFormat
    config: AgentConfig
    fmt: str
    batcher: Any
    stages: SandboxStages


class _Fatal(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class EpisodeRunner:
    """Runs one episode (see the module doc); create one per episode and `await run()`."""

    def __init__(self, ctx: EpisodeContext, task: Task, policy: Any, episode_id: str):
        self.ctx = ctx
        self.cfg = ctx.config
        self.task = task
        self.policy = policy
        self.episode_id = episode_id
        self.single = self.cfg.mode == "single_turn"
        self.tools = SINGLE_TURN_TOOLS if self.single else MULTI_TURN_TOOLS
        self.ws = AgentWorkspace(task.reference, ctx.fmt)
        self.messages = [Message("system", system_prompt(ctx.fmt, self.cfg.mode, self.cfg.max_turns, self.cfg.skill)),
                         Message("user", task_prompt(task, ctx.fmt, self.cfg.mode))]
        self.record = ChatTokens(ctx.chat, self.messages)
        self.turn_starts: list[int] = []
        self.tool_log: list[dict[str, Any]] = []
        self.best: tuple[float, int, EvalResult] | None = None
        self.stats: dict[str, Any] = {"turns": 0, "tool_calls": 0, "malformed_turns": 0, "no_call_turns": 0,
                                      "unknown_tools": 0, "refused_writes": 0, "refused_finishes": 0,
                                      "sampled_tokens": 0, "truncated_turns": 0, "generate_wait_s": 0.0,
                                      "sandbox_s": 0.0, "sandbox_calls": 0}
        self._jobs = 0

    # ------------------------------------------------------------------------------------------ the loop
    async def run(self) -> Episode:
        t0 = time.monotonic()
        status, error = "", ""
        try:
            status = await self._turns(t0)
        except _Fatal as f:
            status, error = f.status, str(f)
        final: EvalResult | None = None
        reward, source = -1.0, "final"
        if status not in NOT_TRAINABLE:
            try:
                final = await self._stage("final")
            except _Fatal as f:
                status, error = f.status, str(f)
            else:
                if final.status == Status.INTERNAL_ERROR.value:
                    status, error = "sandbox_error", f"final evaluation: {final.message}"
                reward = float(final.reward)
                if self.cfg.reward_from == "best" and self.best is not None and self.best[0] > reward:
                    reward, source = self.best[0], f"best (profile at turn {self.best[1]})"
        ids, mask, logprobs = self.record.arrays()
        gen = len(self.ctx.chat.generation_prompt())
        if len(ids) >= gen and not mask[-gen:].any() and ids[-gen:].tolist() == self.ctx.chat.generation_prompt():
            ids, mask, logprobs = ids[:-gen], mask[:-gen], logprobs[:-gen]  # nothing was sampled after it
        self.stats.update(wall_s=time.monotonic() - t0, context_tokens=int(len(ids)))
        return Episode(episode_id=self.episode_id, task=self.task, fmt=self.ctx.fmt, mode=self.cfg.mode,
                       policy_name=str(getattr(self.policy, "name", "policy")),
                       policy_version=int(getattr(self.policy, "version", -1)), messages=list(self.messages),
                       tokens=ids, loss_mask=mask.astype(np.uint8), logprobs=logprobs,
                       turn_starts=list(self.turn_starts), status=status, reward=reward, reward_source=source,
                       final=final, files=self.ws.snapshot(), tool_log=self.tool_log, stats=self.stats, error=error)

    async def _turns(self, t0: float) -> str:
        cfg = self.cfg
        max_turns = 1 if self.single else cfg.max_turns
        tok = self.ctx.chat.tokenizer
        from actors.sampler import FINISH_LENGTH, SamplingParams

        for turn in range(max_turns):
            if time.monotonic() - t0 > cfg.episode_time_s:
                return "time_limit"
            room = cfg.max_context_tokens - len(self.record.ids)
            if room < cfg.min_new_tokens_per_turn:
                return "context_exhausted"
            cap = min(cfg.max_new_tokens_per_turn, room)
            params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                    max_new_tokens=cap, stop_token_ids=tuple(tok.stop_token_ids))
            t = time.monotonic()
            try:
                completion = await self.ctx.batcher.generate(self.policy, self.record.context(), params)
            except Exception as e:  # noqa: BLE001 - the policy failed: the episode ends, the actor goes on
                raise _Fatal("policy_error", f"turn {turn}: {type(e).__name__}: {e}") from None
            finally:
                self.stats["generate_wait_s"] += time.monotonic() - t
            if completion.finish_reason == FINISH_LENGTH and cap < cfg.max_new_tokens_per_turn:
                return "context_exhausted"  # cut by the context, not by the turn limit: dropped
            if completion.finish_reason == FINISH_LENGTH:
                self.stats["truncated_turns"] += 1
            self.turn_starts.append(len(self.record.ids))
            text = self.record.add_sampled(completion.tokens, completion.logprobs)
            self.messages.append(Message("assistant", text))
            self.stats["turns"] += 1
            self.stats["sampled_tokens"] += len(completion.tokens)
            last = turn == max_turns - 1
            observations, finished = await self._act(text, turn, last)
            if finished or self.single:
                return "finished"
            if last:
                return "max_turns"
            observations = _neutralised(observations)
            self.record.add_observation(observations)
            self.messages.extend(observations)
        return "max_turns"

    # ------------------------------------------------------------------------------------------ tools
    async def _act(self, text: str, turn: int, last: bool) -> tuple[list[Message], bool]:
        """Run the tool calls of one assistant turn; returns (observation messages, finish called)."""
        cfg = self.cfg
        names = ", ".join(self.tools)
        try:
            calls = parse_tool_calls(text)
        except ToolCallError as e:
            self.stats["malformed_turns"] += 1
            self.tool_log.append({"turn": turn, "tool": "", "ok": False, "error": f"malformed: {e}"[:300]})
            return [Message("tool", f"error: malformed tool call: {e}. No tool was run. Write each call as "
                                    '<tool_call>\n{"name": "<tool>", "arguments": {...}}\n</tool_call> '
                                    f"with one JSON object. Tools: {names}.")], False
        if not calls:
            self.stats["no_call_turns"] += 1
            self.tool_log.append({"turn": turn, "tool": "", "ok": False, "error": "no tool call"})
            return [Message("user", f"Your reply has no tool call. Call a tool ({names}) to go on; call finish "
                                    "when you are done.")], False
        out: list[Message] = []
        for i, call in enumerate(calls):
            if i >= cfg.max_tool_calls_per_turn:
                out.append(Message("tool", f"{call.name}: not run: at most {cfg.max_tool_calls_per_turn} tool calls "
                                           "per reply"))
                continue
            self.stats["tool_calls"] += 1
            if call.name == "finish" and "finish" in self.tools:
                bad = self._check_args(call)
                if cfg.verify_on_finish and not last and ENTRY in self.ws.files:
                    res = await self._stage("verify")
                    # a sandbox failure is not the solution's: the final evaluation decides
                    if not res.ok and res.status != Status.INTERNAL_ERROR.value:
                        text = verify_observation(res, cfg.compile_error_lines, cfg.observation_max_chars)
                        refusal = [*out, Message("tool", refused_finish_observation(text, cfg.observation_max_chars))]
                        refusal += [Message("tool", f"{c.name[:80]}: not run: finish was refused")
                                    for c in calls[i + 1:]]
                        if self._room_after(refusal):
                            self.stats["refused_finishes"] += 1
                            self.tool_log.append({"turn": turn, "tool": "finish", "ok": False, "status": res.status,
                                                  "error": "refused: verification failed"})
                            return refusal, False
                self.tool_log.append({"turn": turn, "tool": "finish", "ok": not bad})
                return out, True
            text_out, info = await self._tool(call, turn, last)
            self.tool_log.append({"turn": turn, "tool": call.name, **info})
            out.append(Message("tool", clip(text_out, cfg.observation_max_chars)))
        return out, False

    def _room_after(self, observations: list[Message]) -> bool:
        """Whether another turn could still be sampled after these observations (context room)."""
        used = len(self.record.ids) + len(self.ctx.chat.render_observation(_neutralised(observations)))
        return self.cfg.max_context_tokens - used >= self.cfg.min_new_tokens_per_turn

    def _check_args(self, call: ToolCall) -> str:
        spec = _TOOL_ARGS[call.name]
        unknown = sorted(set(call.arguments) - set(spec))
        if unknown:
            return f"{call.name}: unknown argument(s) {unknown}; it takes {sorted(spec) or 'no arguments'}"
        for arg, typ in spec.items():
            if arg not in call.arguments:
                return f"{call.name}: missing argument {arg!r} ({typ.__name__})"
            if not isinstance(call.arguments[arg], typ):
                return (f"{call.name}: argument {arg!r} must be a {typ.__name__}, got "
                        f"{type(call.arguments[arg]).__name__}")
        return ""

    async def _tool(self, call: ToolCall, turn: int, last: bool) -> tuple[str, dict[str, Any]]:
        """One tool call -> (observation text, info for the episode's tool log)."""
        name = call.name
        if name not in self.tools:
            self.stats["unknown_tools"] += 1
            where = " in single-turn mode" if name in _TOOL_ARGS else ""
            return (f"error: unknown tool {name[:80]!r}{where}; the tools are: {', '.join(self.tools)}",
                    {"ok": False, "error": "unknown tool"})
        bad = self._check_args(call)
        if bad:
            return f"error: {bad}", {"ok": False, "error": "bad arguments"}
        a = call.arguments
        if name == "write_file":
            try:
                return self.ws.write(a["path"], a["content"]), {"ok": True, "path": a["path"][:200]}
            except WorkspaceRuleError as e:
                self.stats["refused_writes"] += 1
                return f"write_file refused: {e}", {"ok": False, "error": "refused write", "path": str(a["path"])[:200]}
        if name == "read_file":
            try:
                return self.ws.read(a["path"], self.cfg.read_file_max_chars), {"ok": True}
            except WorkspaceRuleError as e:
                return f"read_file: {e}", {"ok": False, "error": "no such file"}
        if name == "list_files":
            return self.ws.listing(), {"ok": True}
        # compile / verify / profile
        if last:
            return (f"{name}: not run: this was your last reply; the workspace is evaluated now",
                    {"ok": False, "error": "last turn"})
        if ENTRY not in self.ws.files:
            return (f"{name}: {ENTRY} does not exist yet; write it (and your kernels) with write_file first",
                    {"ok": False, "error": "no model_new.py"})
        res = await self._stage(name)
        info: dict[str, Any] = {"ok": res.ok, "status": res.status,
                                "sandbox_ms": round(float(res.stage_ms.get("node", res.stage_ms.get("total", 0.0))), 1)}
        cfg = self.cfg
        if name == "compile":
            return compile_observation(res, cfg.compile_error_lines, cfg.observation_max_chars), info
        if name == "verify":
            return verify_observation(res, cfg.compile_error_lines, cfg.observation_max_chars), info
        info["reward"] = float(res.reward)
        if res.ok and (self.best is None or res.reward > self.best[0]):
            self.best = (float(res.reward), turn, res)
        return profile_observation(res, cfg.compile_error_lines, cfg.observation_max_chars), info

    async def _stage(self, stage: str) -> EvalResult:
        self._jobs += 1
        job_id = f"{self.episode_id}-{self._jobs}-{stage}"
        batcher = self.ctx.batcher
        batcher.in_tools += 1
        t = time.monotonic()
        try:
            return await self.ctx.stages.run(stage, self.task, self.ws.snapshot(), self.ctx.fmt, job_id)
        except SandboxUnavailable as e:
            raise _Fatal("sandbox_error", f"{stage}: {e}") from None
        finally:
            batcher.in_tools -= 1
            self.stats["sandbox_s"] += time.monotonic() - t
            self.stats["sandbox_calls"] += 1
