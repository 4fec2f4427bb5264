"""Test OpenEnv environment with a typed action (a grid walk), built with OpenEnv's create_app."""
