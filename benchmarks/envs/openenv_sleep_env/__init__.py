"""The scale benchmark's OpenEnv environment: every step takes ``SLEEP_ENV_SECONDS`` (1.0 s)."""
