"""A two-seat env (like verifiers' ``kuhn_poker_v1``), which the adapter must refuse: Gymnasium's
contract has one agent per env. Each seat names a number; the higher one wins."""

import verifiers.v1 as vf


class DuelData(vf.TaskData):
    info: dict


class DuelTask(vf.Task[DuelData]):
    pass


class DuelEnvConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    second: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class DuelEnv(vf.Env[DuelEnvConfig]):
    async def run(self, task, agents):
        seats = [vf.Task(vf.TaskData(idx=task.data.idx, prompt="Name a number.")) for _ in range(2)]
        first = await agents.first.run(seats[0])
        second = await agents.second.run(seats[1])
        a, b = (int(t.last_reply or 0) for t in (first, second))
        first.record_reward("won", float(a > b))
        second.record_reward("won", float(b > a))


class DuelTaskset(vf.Taskset[DuelTask, vf.TasksetConfig]):
    def load(self):
        return [DuelTask(DuelData(name="duel-0", prompt=None, info={}), self.config.task)]


__all__ = ["DuelEnv", "DuelTaskset"]
