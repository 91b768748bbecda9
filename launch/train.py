"""Train (or pretrain) a learner on CFSL tasks, then test it: results.json, results.csv, a table.

    python -m launch.train --learner=protonets --dataset=synthetic --task=B3 --workdir=/tmp/pn
    python -m launch.train --learner=maml_low --dataset=omniglot \\
        --manual_dir=FOLDER_WITH_ZIPS --task=C3 --epochs=20 --workdir=/tmp/maml

Re-running with the same --workdir resumes an interrupted run where it stopped
(Ctrl-C, SIGTERM, SIGUSR1 or SIGUSR2 checkpoints the step reached first and exits
with 128 + the signal's number), and prints the stored results of a
finished one (--retest tests it again). Spec flags (--nss, --cci, ...) override
the fields of --task. Every split the run samples tasks from is checked against
the spec, and the first step's memory against the device's, before training.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("train", __package__))

import math

from absl import flags

from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.runtime import files, naming
from cfsl_jax.training import as_published, budgets
from cfsl_jax.learners import options_class
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.training.pack_runs import (PACK_AXES, check_seeds, check_steps_per_dispatch,
                                         pack_configs)

# The library (JAX) is imported once the flags are parsed (``import_library``).
from . import cli, config_flags, starting
from .checks import check_data_flags, check_output_dir, parse_task
from .flag_types import define_list
from .options import (define_backend_flags, define_data_flags, define_deprecated_flag,
                      learner_options_from_flag, list_options)

flags.DEFINE_string("workdir", None, "Run directory (checkpoints, results; a local path or "
                    "gs://BUCKET/PATH); required.")
flags.DEFINE_enum("as_published", "none", as_published.NAMES, "Preset of one paper-era "
                  "version of the authors' code: feb2020 (commit 39025a3: Table 1's A/B/C cells) "
                  "or apr2020 (5b814ac: its D cells); a bundle of --draws, --target_mode, "
                  "--label_offset and learner options (docs/fidelity.md). Explicit flags and "
                  "options win over it.")
flags.DEFINE_enum("budget", "default", tuple(budgets.BUDGETS), "Schedule preset: default "
                  "(10 x 100 x 8), quick (3 x 20 x 4, 100 val tasks), paper (250 epochs x 500 "
                  "steps x 1 task, 600 val/test tasks, top-5 ensemble, task pretraining). "
                  "Explicit --epochs, --iters_per_epoch, ... win over it.")
flags.DEFINE_integer("num_devices", 0, "Devices to shard the task batch over (0: all).")
flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first (TPU pod "
                  "slices, multi-node GPU: run the same command on every host).")
define_deprecated_flag("eval_tasks")
flags.DEFINE_bool("retest", False, "Test a finished run again (otherwise its stored results "
                  "are printed); the recorded wall time stays the training run's.")
flags.DEFINE_bool("list_options", False, "Print the options of --learner (type, default, help) "
                  "and exit.")
define_list("seeds", [], "Seeds. launch.train: train them as one pack (README, \"Packing "
            "runs\"), run S into WORKDIR/seedS, not with --seed; launch.sweep: the grid's "
            "seeds (default 0,1,2).", module=__name__)
define_list("learning_rates", [], "Learning rates (launch.train): train each with each of --seeds "
            "(or --seed) as one pack, run at rate R with seed S into WORKDIR/lrR/seedS "
            "(README, \"Packing runs\"); not with --learning_rate.", module=__name__)
flags.DEFINE_integer("steps_per_dispatch", 1, "Meta-steps per host call in a pack (it divides "
                     "--iters_per_epoch, --log_every and --checkpoint_every).", lower_bound=1)
flags.DEFINE_enum("pack_axis", "auto", PACK_AXES, "How a pack computes its runs: vmap "
                  "(batched), map (one after another in one program), auto (map on CPU, vmap "
                  "on GPU/TPU). Not part of a run's config.")
define_backend_flags()
FLAGS = flags.FLAGS


def import_library(command: str = "train") -> None:
    """The modules ``command`` runs (JAX, orbax, TFDS), imported once absl has parsed its flags
    (a mistaken flag is refused in a fraction of a second), inside ``starting.importing``:
    ``cli.run``'s ``library``. The functions below import them where they use them (at no
    cost by then; also when a test calls them without ``cli.run``)."""
    with starting.importing(command):
        from cfsl_jax.runtime import backend, parallel  # noqa: F401
        from cfsl_jax.training import packing, runs, train  # noqa: F401


def parse_eval_seed(text: str) -> int | None:
    """--eval_seed: a non-negative integer, or 'seed' (None: the run's --seed)."""
    text = text.strip()
    if text == "seed":
        return None
    if not text.isdigit():
        raise cli.UserError(f"--eval_seed={text}: give a non-negative integer or 'seed'")
    return int(text)


_DATA = define_data_flags()
# Every TrainConfig field is a flag (its help, choices and limits on the field); the spec
# flags (--nss, --nc, ...) are TaskSpec's fields and replace those of --task.
TRAIN = config_flags.define(TrainConfig, __name__, defined=tuple(_DATA.flags), parsers=dict(
    _DATA.parsers, task=parse_task, eval_seed=parse_eval_seed,
    learner_options=lambda pairs: learner_options_from_flag(FLAGS.learner, pairs)))
SPEC = config_flags.define(TaskSpec, __name__, overrides=True)
# The flags that set no TrainConfig field (tests/test_config_flags.py checks the lists).
NOT_CONFIG = ("workdir", "as_published", "budget", "num_devices", "multihost", "eval_tasks",
              "retest", "list_options", "precision", "compilation_cache_dir", "seeds",
              "learning_rates", "steps_per_dispatch", "pack_axis")


def flag_words():
    """Inside: a TrainConfig or TaskSpec mistake names the flag (``--test_tasks``)."""
    return naming.field_names({**TRAIN.names(), **SPEC.names()})


def config_from_flags(learner_options: dict | None = None,
                      per_learner: bool = True) -> TrainConfig:
    """The flags' config under --budget and --as_published, checked (a mistake is a UserError
    naming its flag); ``learner_options`` in place of --learner_option's (``per_learner=False``:
    without the preset's learner options, which a sweep adds per learner)."""
    given = {} if learner_options is None else {"learner_options": learner_options}
    with cli.user_input(), flag_words():
        config = TrainConfig(**TRAIN.values(**given), spec_overrides=SPEC.values())
        config = budgets.apply(config, FLAGS.budget, keep=TRAIN.present())
        config = as_published.apply(config, FLAGS.as_published, per_learner=per_learner)
        config.check()
    return config


def listed_options() -> bool:
    """With --list_options: print the options of --learner and return True."""
    if FLAGS.list_options:
        print(list_options(f"options of --learner={FLAGS.learner} (--learner_option=NAME=VALUE)",
                           options_class(FLAGS.learner)))
    return FLAGS.list_options


def require_workdir() -> None:
    if not FLAGS.workdir:
        raise cli.UserError("--workdir is required")


def mesh_from_flags():
    """The device mesh of --num_devices (after --multihost's distributed initialisation)."""
    from cfsl_jax.runtime import parallel
    parallel.initialize(FLAGS.multihost)
    with cli.user_input():
        return parallel.make_mesh(FLAGS.num_devices)


def check() -> TrainConfig:
    """The run's config, its paths and its workdir checked (nothing is created)."""
    from cfsl_jax.training import runs
    require_workdir()
    check_data_flags()
    check_output_dir("workdir", FLAGS.workdir)
    config = config_from_flags()
    seeds, rates, workdirs = pack_runs()
    configs = pack_configs(config, seeds, rates)  # as the pack builds them
    check_pack_flags([config], len(configs) > 1, "applies to a pack (--seeds or "
                     "--learning_rates with two or more runs); this command trains one run")
    for c, workdir in zip(configs, workdirs):
        runs.check_workdir_config(workdir, c, create=False)
    return config


def check_pack_flags(configs: list[TrainConfig], packed: bool, why_not: str) -> None:
    """--steps_per_dispatch and --pack_axis say how a pack trains: set without one, refused
    (``why_not`` says why there is none); S must divide each config's intervals."""
    given = [f"--{name}={FLAGS[name].value}" for name in ("steps_per_dispatch", "pack_axis")
             if FLAGS[name].value != FLAGS[name].default]
    if given and not packed:
        raise cli.UserError(f"{' '.join(given)}: {why_not}")
    for config in configs:
        check_steps_per_dispatch(config, FLAGS.steps_per_dispatch)


def pack_runs() -> tuple[list[int], list[float] | None, list[str]]:
    """The runs' seeds, learning rates (None: --learning_rate's for every run) and workdirs:
    --seed in --workdir, each of --seeds in WORKDIR/seedS, and with --learning_rates each rate
    R with each seed in WORKDIR/lrR/seedS."""
    if not FLAGS.seeds and not FLAGS.learning_rates:
        return [FLAGS.seed], None, [FLAGS.workdir]
    seeds = [FLAGS.seed]
    if FLAGS.seeds:
        given = ",".join(FLAGS.seeds)
        if FLAGS["seed"].present:
            raise cli.UserError(f"--seeds={given} and --seed={FLAGS.seed}: give one of them")
        try:
            seeds = list(check_seeds([int(seed) for seed in FLAGS.seeds]))
        except cli.UserError:
            raise
        except ValueError:
            raise cli.UserError(f"--seeds={given}: seeds are integers, e.g. --seeds=0,1,2"
                                ) from None
    if not FLAGS.learning_rates:
        return seeds, None, [files.join(FLAGS.workdir, f"seed{seed}") for seed in seeds]
    runs_ = [(seed, rate) for rate in learning_rates() for seed in seeds]
    return ([seed for seed, _ in runs_], [rate for _, rate in runs_],
            [files.join(FLAGS.workdir, f"lr{rate!r}", f"seed{seed}") for seed, rate in runs_])


def learning_rates() -> list[float]:
    """--learning_rates as distinct positive floats (a UserError naming the value otherwise)."""
    given = ",".join(FLAGS.learning_rates)
    if FLAGS["learning_rate"].present:
        raise cli.UserError(f"--learning_rates={given} and --learning_rate="
                            f"{FLAGS.learning_rate}: give one of them")
    rates = []
    for text in FLAGS.learning_rates:
        try:
            rate = float(text)
        except ValueError:
            rate = float("nan")
        if not math.isfinite(rate) or rate <= 0:
            raise cli.UserError(f"--learning_rates={given}: {text} is not a positive number")
        if rate in rates:
            raise cli.UserError(f"--learning_rates={given}: {text} is given twice; give "
                                f"distinct rates")
        rates.append(rate)
    return rates


def main(argv) -> None:
    from cfsl_jax.training import packing, train
    del argv  # cli.run refuses extra arguments
    if listed_options():
        return
    config = check()
    mesh = mesh_from_flags()
    with cli.flags_recorded(FLAGS.workdir):
        if FLAGS.seeds or FLAGS.learning_rates:
            seeds, rates, workdirs = pack_runs()
            packing.train_pack(config, seeds, workdirs, FLAGS.steps_per_dispatch,
                               pack_axis=FLAGS.pack_axis, learning_rates=rates)
            return
        train.train_and_evaluate(config, FLAGS.workdir, mesh=mesh, retest=FLAGS.retest)


def run() -> None:
    cli.run(main, check=check, library=import_library)
