"""Servers and backends for tests and offline demos: never a real model or a real service.

``openai_stub`` is an OpenAI-compatible chat server that solves the Arithmetic example;
``latency`` is an in-process backend whose steps take lognormal time.
"""
