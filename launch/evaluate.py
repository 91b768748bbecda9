"""Test a run from its workdir, or a learner that needs no training on a fresh init.

    python -m launch.evaluate --workdir=/tmp/pn                  # re-test a finished run
    python -m launch.evaluate --workdir=/tmp/it --learner=init_tune --task=B10

With a workdir that holds a run, it is tested again from its checkpoints (the
recorded wall time stays the training run's). With a new workdir, the train
flags (--learner, --dataset, --task, ...) say what to evaluate; only learners
with training="none" or "pretrain" qualify (a pretrain learner is pretrained
first). Writes results.json, results.csv and (a new run) flags.txt into the workdir
and prints the table; progress lines show tasks done and the ETA.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("evaluate", __package__))

from absl import flags

from cfsl_jax.runtime import files
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.learners import get_learner

# The library (JAX) is imported once the flags are parsed (``train_cli.import_library``).
from . import cli
from .checks import check_data_flags
from . import train as train_cli  # noqa: F401  (defines the shared flags)

FLAGS = flags.FLAGS


def check() -> TrainConfig | None:
    """None for a workdir holding a run, else the config of a learner that needs no training
    (checked; nothing is created)."""
    from cfsl_jax.training import runs
    train_cli.require_workdir()
    workdir = FLAGS.workdir
    check_data_flags()
    files.check_url("workdir", workdir)
    if files.exists(files.join(workdir, "config.json")):
        check_same_run(workdir, runs.load_config(workdir))
        return None
    if files.exists(workdir) and not files.isdir(workdir):
        raise cli.UserError(f"--workdir={workdir} is a file, not a folder")
    if not FLAGS["learner"].present and not files.exists(workdir):
        raise cli.UserError(f"--workdir={workdir} does not exist (give a finished run's folder, "
                            f"or --learner to evaluate a learner that needs no training)")
    if not FLAGS["learner"].present:
        raise cli.UserError(f"--workdir={workdir} holds no run (no config.json); to evaluate a "
                            f"learner that needs no training there, give --learner (and "
                            f"--task, --dataset)")
    config = train_cli.config_from_flags()
    with cli.user_input():
        learner = get_learner(config.learner, config.spec, **config.learner_options)
    if learner.recipe.training == "meta":
        missing = (f"--workdir={workdir} does not exist, and " if not files.exists(workdir)
                   else "")
        raise cli.UserError(f"{missing}--learner={config.learner} is meta-trained: run "
                            f"launch.train first, or give the --workdir of a finished run")
    return config


# Flags that say which run to test: given with a workdir that holds a run, they must be its.
_IDENTITY_FLAGS = {"learner": "learner", "dataset": "dataset", "task": "task", "seed": "seed"}


def check_same_run(workdir: str, stored: TrainConfig) -> None:
    """Every config flag given with a run's workdir must say what the run is (the run is
    re-tested as it was trained; a contradicting flag would be ignored): --learner, --dataset,
    --task and --seed, then the rest (an option given says its own value only)."""
    for flag, field in _IDENTITY_FLAGS.items():
        if not FLAGS[flag].present:
            continue
        given, recorded = FLAGS[flag].value, getattr(stored, field)
        if str(given).strip().upper() != str(recorded).upper():
            raise cli.UserError(
                f"--{flag}={given} contradicts the run in --workdir={workdir} ({field} "
                f"{recorded}): drop --{flag} to re-test that run, or give a new --workdir to "
                f"evaluate --{flag}={given}")
    differing = _contradicted(stored)
    differing += [(field, getattr(stored.spec, field)) for field in train_cli.SPEC.present()
                  if train_cli.SPEC.parse(field) != getattr(stored.spec, field)]
    if differing:
        flags_ = {**train_cli.TRAIN.flags, **train_cli.SPEC.flags}
        named = [flags_[f] for f, _ in differing if FLAGS[flags_[f]].present]
        named += [flag for flag in ("budget", "as_published") if FLAGS[flag].present
                  and len(named) < len(differing)]
        raise cli.UserError(
            f"{' '.join(_typed(flag) for flag in dict.fromkeys(named))} contradicts the run in "
            f"--workdir={workdir} ({'; '.join(f'{f} {v!r}' for f, v in differing)}): drop it "
            f"to re-test that run as it was trained, or give a new --workdir")


def _typed(flag: str) -> str:
    value = FLAGS[flag].value
    return " ".join(f"--{flag}={v}" for v in (value if isinstance(value, list) else [value]))


def _contradicted(stored: TrainConfig) -> list[tuple[str, object]]:
    """(field, recorded value) of the config flags given (--budget and --as_published with the
    fields they set) whose value is not the run's; options: only the names given."""
    with cli.user_input():
        flagged = TrainConfig(**train_cli.TRAIN.values(), spec_overrides={})
        full = train_cli.config_from_flags()
    fields = [f for f in train_cli.TRAIN.present() if f not in _IDENTITY_FLAGS.values()]
    if FLAGS["budget"].present or FLAGS["as_published"].present:
        fields += [f for f, value in full.to_json().items()
                   if value != flagged.to_json()[f] and f not in fields]
    out = []
    for field in fields:
        mine, recorded = getattr(full, field), getattr(stored, field)
        if isinstance(mine, dict):  # the options given, each against the run's
            given = getattr(flagged, field) if field in train_cli.TRAIN.present() else mine
            mine = {name: given[name] for name in given}
            recorded = {name: recorded.get(name) for name in given}
        if mine != recorded:
            out.append((field, recorded))
    return out


def main(argv) -> None:
    from cfsl_jax.training import runs, train
    del argv
    if train_cli.listed_options():
        return
    config = check()
    mesh = train_cli.mesh_from_flags()
    if config is None:
        with train.workdir_locked(FLAGS.workdir):  # no trainer or other re-test at once
            runs.evaluate_run(FLAGS.workdir, num_tasks=None, mesh=mesh)
    else:  # a new run: its flags as W/flags.txt, as launch.train writes them
        with cli.flags_recorded(FLAGS.workdir):
            train.train_and_evaluate(config, FLAGS.workdir, mesh=mesh, retest=FLAGS.retest)


def run() -> None:
    cli.run(main, check=check, library=lambda: train_cli.import_library("evaluate"))
