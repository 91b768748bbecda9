"""Shared flag helpers of the launch scripts (flags are defined only when a script asks)."""

from __future__ import annotations

import ast

from absl import app, flags


def define_data_flags() -> None:
    """--dataset_option, --data_dir and --manual_dir: where a dataset comes from."""
    flags.DEFINE_multi_string("dataset_option", [], "Dataset option NAME=VALUE (repeatable), "
                              "e.g. --dataset_option=num_classes=200 for synthetic.")
    flags.DEFINE_string("data_dir", None, "Where prepared TFDS datasets live.")
    flags.DEFINE_string("manual_dir", None, "Folder with the official archives.")


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


class _ThirdPartyInfoFilter:
    """Drops INFO records of libraries that log every checkpoint write or backend probe."""

    NOISY = ("/orbax/", "/jax/_src/xla_bridge", "/tensorflow_datasets/", "/etils/")

    def filter(self, record) -> bool:
        import logging as std_logging
        return record.levelno > std_logging.INFO or not any(
            part in record.pathname for part in self.NOISY)


def quiet_third_party_logs() -> None:
    """Keep our progress lines at INFO, without orbax's and jax's per-call INFO chatter."""
    from absl import logging
    logging.get_absl_handler().addFilter(_ThirdPartyInfoFilter())
