"""Process facts for tests and benchmarks: the ones of :mod:`openenv_gym.processes`, by the name
the suite has always used."""

from openenv_gym.processes import alive, children, cmdline, descendants, parents, rss_kib, terminate, wait_dead

__all__ = ["alive", "parents", "children", "descendants", "cmdline", "rss_kib", "wait_dead", "terminate"]
