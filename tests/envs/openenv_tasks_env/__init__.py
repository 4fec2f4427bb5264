"""Test OpenEnv environment with the task API (splits, tasks), built with OpenEnv's create_app."""
