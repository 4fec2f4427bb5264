"""A tool taskset for the Verifiers v1 adapter tests: multiply with the ``calc_multiply`` tool.

Reward: exact match of the final reply; metric ``tool_calls``: how many tool results the trace
holds. By default the tool runs in its own MCP server process per rollout (``Task.toolsets``,
spawned as ``python -m vf1_calc.tools``); with the task knob ``shared_tools=True`` one server
serves every rollout of the taskset (``Taskset.toolsets``), which makes resets much cheaper.
"""

import verifiers.v1 as vf

from vf1_calc.tools import CalcTools

PROBLEMS = [(12, 13), (7, 8)]


class CalcData(vf.TaskData):
    answer: str


class CalcTaskConfig(vf.TaskConfig):
    shared_tools: bool = False


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [] if config.shared_tools else [CalcTools(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcTasksetConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcTasksetConfig]):
    @classmethod
    def toolsets(cls, config: CalcTasksetConfig) -> list[vf.Toolset]:
        return [CalcTools(vf.SharedToolsetConfig())] if config.task.shared_tools else []

    def load(self):
        for a, b in PROBLEMS:
            yield CalcTask(
                CalcData(prompt=f"What is {a} * {b}? Use the calc_multiply tool, then answer with the number only.",
                         answer=str(a * b)),
                self.config.task,
            )


__all__ = ["CalcTaskset"]
