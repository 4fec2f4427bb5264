"""The echo test environment speaks MCP: its wire types are OpenEnv's CallToolAction/Observation."""

from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

__all__ = ["CallToolAction", "CallToolObservation"]
