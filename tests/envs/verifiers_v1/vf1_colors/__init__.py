"""A single-agent env that scripts the user's turns, for the Verifiers v1 adapter tests.

Modelled on verifiers' own ``color_codeword_v1`` (v0.3.0): ``ColorsEnv`` subclasses
``vf.SingleAgentEnv`` and its ``run()`` drives ``agents.agent.interaction(task)``. The task's
prompt shows the first squares (images as OpenAI content parts); after each answer the env sends
the next squares as a scripted user turn, and it ends the exchange itself, either when every
turn is answered or at once when an answer is not the codeword so far. The reward is an exact
match of the final codeword; ``partial_match`` (a metric) counts right letters; ``finalize``
records how many turns the env showed (``turns_shown``).
"""

import verifiers.v1 as vf
from PIL import Image
from verifiers.v1.utils.image import image_data_url

COLORS = {"red": ((255, 0, 0), "A"), "green": ((0, 255, 0), "B"), "blue": ((0, 0, 255), "C"),
          "yellow": ((255, 255, 0), "D")}
SEQUENCES = [  # three turns of two squares each
    ["red", "blue", "green", "green", "yellow", "red"],
    ["blue", "yellow", "yellow", "red", "green", "blue"],
]
SYSTEM_PROMPT = ("Each square stands for a letter: red=A, green=B, blue=C, yellow=D. After each turn, "
                 "answer with the codeword so far, letters only.")


def square(color: str) -> vf.ImageUrlContentPart:
    url = image_data_url(Image.new("RGB", (8, 8), COLORS[color][0]))
    return vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url=url))


def codeword(colors: list[str]) -> str:
    return "".join(COLORS[c][1] for c in colors)


class ColorsData(vf.TaskData):
    answer: str
    info: dict


class ColorsTask(vf.Task[ColorsData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    async def partial_match(self, trace: vf.Trace) -> float:
        reply = trace.last_reply.strip()
        return sum(a == b for a, b in zip(self.data.answer, reply)) / len(self.data.answer)


class ColorsEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        turns = task.data.info["turns"]
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            for n in range(1, len(turns)):
                if segment.terminated or segment.last_reply != codeword(sum(turns[:n], [])):
                    break  # the env decides: a wrong answer ends the exchange
                parts = [square(c) for c in turns[n]]
                parts.append(vf.TextContentPart(text=f"Turn {n + 1}: {len(turns[n])} more squares."))
                segment = await interaction.turn([vf.UserMessage(content=parts)])

    async def finalize(self, task, episode):
        for trace in episode.traces:
            shown = sum(1 for m in trace.messages if getattr(m, "role", None) == "user")
            trace.record_metric("turns_shown", float(shown))


class ColorsTaskset(vf.Taskset[ColorsTask, vf.TasksetConfig]):
    def load(self):
        for n, sequence in enumerate(SEQUENCES):
            turns = [sequence[i:i + 2] for i in range(0, len(sequence), 2)]
            parts = [*(square(c) for c in turns[0]), vf.TextContentPart(text="Turn 1: 2 squares.")]
            yield ColorsTask(
                ColorsData(name=f"colors-{n}", prompt=[vf.UserMessage(content=parts)],
                           system_prompt=SYSTEM_PROMPT, answer=codeword(sequence), info={"turns": turns}),
                self.config.task,
            )


__all__ = ["ColorsEnv", "ColorsTaskset"]
