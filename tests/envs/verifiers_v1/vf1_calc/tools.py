"""The calculator tool server of ``vf1_calc``: a Verifiers v1 MCP Toolset, one process per rollout.

The library spawns it as ``python -m vf1_calc.tools``, so the package must be importable by the
child (the adapter puts the source's parent on an absolute ``PYTHONPATH``).
"""

import verifiers.v1 as vf


class CalcTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


if __name__ == "__main__":
    CalcTools.run()
