"""The package version (the floor stage: imports nothing)."""

__version__ = "0.1.0"
