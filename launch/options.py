"""Shared flag helpers of the launch scripts (flags are defined only when a script asks)."""

from __future__ import annotations

import ast

from absl import app, flags


def define_data_flags() -> None:
    """--dataset_option, --data_dir and --manual_dir: where a dataset comes from."""
    flags.DEFINE_multi_string("dataset_option", [], "Dataset option NAME=VALUE (repeatable), "
                              "e.g. --dataset_option=num_classes=200 for synthetic.")
    flags.DEFINE_string("data_dir", None, "Where prepared TFDS datasets live.")
    flags.DEFINE_string("manual_dir", None, "Folder with the official archives (Omniglot: "
                        "images_background.zip and images_evaluation.zip, or the two *_small "
                        "zips).")
    flags.DEFINE_bool("download", False, "Download a dataset's archives when they are not in "
                      "--manual_dir (Omniglot only; otherwise a missing archive is an error).")


def define_backend_flags() -> None:
    """--precision and --compilation_cache_dir (``cfsl_jax.backend``); applied by ``cli.run``."""
    from cfsl_jax import backend
    flags.DEFINE_enum("precision", backend.DEFAULT_PRECISION, backend.PRECISIONS,
                      "Float32 matmul/convolution precision on accelerators: default (TF32 on "
                      "recent NVIDIA GPUs, bf16 passes on TPU), high, or highest (full float32). "
                      "CPU computes full float32 under all three.")
    flags.DEFINE_string("compilation_cache_dir", backend.default_cache_dir(),
                        "Persistent XLA compilation cache: a re-run of the same shapes loads its "
                        "programs instead of compiling them. '' disables it.")


def apply_backend_flags() -> None:
    """``backend.configure`` from --precision and --compilation_cache_dir, where a script
    defines them (before any program is traced)."""
    if "precision" not in flags.FLAGS or "compilation_cache_dir" not in flags.FLAGS:
        return
    from cfsl_jax import backend
    backend.configure(flags.FLAGS.precision, flags.FLAGS.compilation_cache_dir)


def parse_options(pairs: list[str], flag: str) -> dict:
    """NAME=VALUE strings -> dict, values read as Python literals where they parse."""
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise app.UsageError(f"--{flag}={pair} is not NAME=VALUE")
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


# ---- learner options: the valid names, from the factories' signatures -----------------------

def _keyword_defaults(fn, seen: set) -> dict:
    """{name: default} of the keyword parameters ``fn`` takes, following ``**options`` into the
    functions and classes of ``cfsl_jax.learners`` that its body names."""
    import importlib
    import inspect
    if fn in seen:
        return {}
    seen.add(fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    found, forwards = {}, False
    for p in signature.parameters.values():
        if p.kind == p.VAR_KEYWORD:
            forwards = True
        elif p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            found[p.name] = p.default
    if forwards and hasattr(fn, "__code__"):
        module = importlib.import_module(fn.__module__)
        for name in fn.__code__.co_names:
            callee = getattr(module, name, None)
            if callable(callee) and str(getattr(callee, "__module__", "")).startswith(
                    "cfsl_jax.learners"):
                for key, value in _keyword_defaults(callee, seen).items():
                    found.setdefault(key, value)
    return found


def learner_option_names(learner: str, spec) -> list[str]:
    """The option names learner ``learner`` accepts (each checked by building it with the
    option at its default)."""
    import importlib
    from cfsl_jax import learners
    module, factory = learners._REGISTRY[learner]
    build = getattr(importlib.import_module(f"cfsl_jax.learners.{module}"), factory)
    valid = []
    for name, default in _keyword_defaults(build, set()).items():
        if name in ("name", "spec", "image_shape", "compute_dtype"):
            continue
        try:
            learners.get_learner(learner, spec, **{name: default})
        except (TypeError, ValueError) as error:
            if isinstance(error, TypeError) or "bad option" in str(error):
                continue
        valid.append(name)
    return sorted(valid)


def check_learner_options(learner: str, spec, options: dict) -> None:
    """UserError naming ``--learner_option`` and the valid names for an unknown option."""
    from cfsl_jax.errors import UserError
    from cfsl_jax.learners import LEARNERS
    if learner not in LEARNERS or not options:
        return
    valid = learner_option_names(learner, spec)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise UserError(f"--learner_option {', '.join(unknown)}: not an option of learner "
                        f"{learner!r}; valid: {', '.join(valid)}")


def flag_names(message: str) -> str:
    """``TrainConfig.test_tasks`` -> ``--eval_tasks``, ``TaskSpec.nc`` -> ``--nc``: a config
    error in the words of the command line."""
    import re
    renamed = {"test_tasks": "eval_tasks", "learner_options": "learner_option",
               "dataset_options": "dataset_option"}
    message = re.sub(r"^(cannot parse task|unknown task preset)", r"--task: \1", message)
    return re.sub(r"\b(?:TrainConfig|TaskSpec)\.(\w+)",
                  lambda m: f"--{renamed.get(m.group(1), m.group(1))}", message)
