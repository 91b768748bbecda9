"""Shared flag helpers of the launch scripts (flags are defined only when a script asks)."""

from __future__ import annotations

from absl import app, flags


DATA_FIELDS = ("dataset_options", "data_dir", "manual_dir", "download")


def define_data_flags() -> "config_flags.ConfigFlags":
    """--dataset_option, --data_dir, --manual_dir and --download (the fields of TrainConfig
    that say where a dataset comes from), paths made absolute and options parsed."""
    from cfsl_jax.training.config import TrainConfig

    from . import config_flags
    from .checks import absolute
    return config_flags.define(TrainConfig, __name__, only=DATA_FIELDS, parsers=dict(
        dataset_options=lambda pairs: parse_options(pairs, "dataset_option"),
        data_dir=absolute, manual_dir=absolute))


def define_backend_flags() -> None:
    """--precision and --compilation_cache_dir (``cfsl_jax.runtime.backend``); applied by ``cli.run``."""
    from cfsl_jax.runtime import backend_options
    flags.DEFINE_enum("precision", backend_options.DEFAULT_PRECISION, backend_options.PRECISIONS,
                      "Float32 matmul/convolution precision on accelerators: default (TF32 on "
                      "recent NVIDIA GPUs, bf16 passes on TPU), high, or highest (full float32). "
                      "CPU computes full float32 under all three.")
    flags.DEFINE_string("compilation_cache_dir", backend_options.default_cache_dir(),
                        "Persistent XLA compilation cache: a re-run of the same shapes loads its "
                        "programs instead of compiling them. '' disables it.")


def apply_backend_flags() -> None:
    """``backend.configure`` from --precision and --compilation_cache_dir, where a script
    defines them (before any program is traced)."""
    if "precision" not in flags.FLAGS or "compilation_cache_dir" not in flags.FLAGS:
        return
    from cfsl_jax.runtime import backend
    backend.configure(flags.FLAGS.precision, flags.FLAGS.compilation_cache_dir)


def parse_options(pairs: list[str], flag: str) -> dict:
    """NAME=VALUE strings -> {NAME: VALUE} (text values: the dataset builder checks them)."""
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise app.UsageError(f"--{flag}={pair} is not NAME=VALUE")
        options[name] = _dataset_value(value)
    return options


def _dataset_value(text: str):
    """A dataset option's value: an int or a float where the text is one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


# Old flag names, accepted with one deprecation line: old -> new.
DEPRECATED_FLAGS = {"eval_tasks": "test_tasks", "compilation_cache": "compilation_cache_dir"}


def define_deprecated_flag(old: str) -> None:
    """Define ``--old`` as the deprecated spelling of ``--DEPRECATED_FLAGS[old]``."""
    new = DEPRECATED_FLAGS[old]
    flags.DEFINE_string(old, None, f"Deprecated: use --{new}.")


def apply_deprecated_flags() -> None:
    """Move each given deprecated flag's value to its new flag, with one line on stderr."""
    import sys
    for old, new in DEPRECATED_FLAGS.items():
        if old not in flags.FLAGS or new not in flags.FLAGS or not flags.FLAGS[old].present:
            continue
        print(f"warning: --{old} is deprecated; use --{new}", file=sys.stderr, flush=True)
        if flags.FLAGS[new].present:
            raise app.UsageError(f"--{old} and --{new} are the same flag: give only --{new}")
        flag = flags.FLAGS[new]
        try:
            flag.value = flag.parser.parse(flags.FLAGS[old].value)
        except ValueError as error:
            raise app.UsageError(f"--{old}={flags.FLAGS[old].value}: {error}") from None
        flag.present = 1


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


def learner_options_from_flag(learner: str, pairs: list[str]) -> dict:
    """--learner_option NAME=VALUE strings of ``learner``, typed and checked (UserError)."""
    from cfsl_jax.learners import LEARNERS, parse_learner_options
    if learner not in LEARNERS or not pairs:
        return {}
    return parse_learner_options(learner, pairs, f"--learner_option for --learner={learner}")


def list_options(title: str, options_class: type) -> str:
    """The text ``--list_options`` prints for one learner or method."""
    from cfsl_jax.runtime.options import describe
    return "\n".join([f"{title} (NAME: TYPE = DEFAULT, then its help):", *describe(options_class)])
