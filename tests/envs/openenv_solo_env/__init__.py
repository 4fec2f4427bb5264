"""Test OpenEnv environment that allows one session per server, as most of OpenEnv's own do."""
