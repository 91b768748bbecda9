"""Shared flag helpers of the launch scripts (defines no flags itself)."""

from __future__ import annotations

import ast

from absl import app


def parse_options(pairs: list[str], flag: str) -> dict:
    """NAME=VALUE strings -> dict, values read as Python literals where they parse."""
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise app.UsageError(f"--{flag}={pair!r} is not NAME=VALUE")
        try:
            options[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[name] = value
    return options
