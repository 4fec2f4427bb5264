"""The package's version, in one place (the package root, the CLI and host processes report it)."""

__version__ = "0.1.0"
