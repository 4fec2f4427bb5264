"""One-tool ors-sdk environments as source text, for the isolation tests to write, import and install."""

from __future__ import annotations

_TEMPLATE = '''
"""{doc}"""
{imports}
from ors import Environment, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel


class Empty(BaseModel):
    pass


class {cls}(Environment):
    @classmethod
    def list_splits(cls):
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split):
        return [{{"id": "0"}}]

    def get_prompt(self):
        return [TextBlock(text="Call the tool.")]

    @tool
    def {tool}(self, params: Empty) -> ToolOutput:
        """Ends the episode with reward 1 and a text that tells which env answered."""
        return ToolOutput(blocks=[TextBlock(text={text})], reward=1.0, finished=True)
'''


def one_tool_env(cls: str, tool: str, text: str, imports: str = "", doc: str = "A one-tool test env.") -> str:
    """The source of an env class ``cls`` whose only tool ``tool`` answers the Python expression ``text``."""
    return _TEMPLATE.format(cls=cls, tool=tool, text=text, imports=imports, doc=doc)
