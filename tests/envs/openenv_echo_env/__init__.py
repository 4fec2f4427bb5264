"""Test OpenEnv MCP environment (echo and a number guess), built with OpenEnv's create_app."""
