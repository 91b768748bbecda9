"""Run the FLUID protocol: every method of the paper's Table 3 on heavy-tailed streams.

    python -m launch.fluid --workdir=/tmp/fluid                    # paper scale, 3 test streams
    python -m launch.fluid --preset=small --workdir=/tmp/fluid_small   # CPU smoke run
    python -m launch.fluid --preset=small --method=ncm,exemplar_tuning --workdir=/tmp/f
    python -m launch.fluid --preset=small --streams=validation --num_streams=2 --workdir=/tmp/v
    python -m launch.fluid --preset=small --study=update_strategy --workdir=/tmp/fluid_us

``--preset=paper``: 1,000 classes (250 pretrain, 750 novel), 90,000 samples,
Zipf s=1, <= 961 per class, head > 50, 3 test streams, mean ± std; pretraining
on 1,000 classes (the 250 pretrain classes and 750 that never enter a stream,
the analogue of ImageNet-1K; --pretrain_classes=stream: the 250 only).
``--preset=small``: 40 classes, 1,200 samples, pretraining on 40 classes.
Stream flags left unset keep the preset's values (--stream_classes alone
scales the pretraining set with it). Each method's schedule is the paper's (4 epochs every
5,000 samples, batch 256; Weight Imprinting from 10,000; OLTR also every 200
up to 10,000) scaled to the stream length, unless --update_every (and
--epochs_per_update, --batch_size) set one for all methods. Writes
results.json, results.txt (Table 3 layout beside the paper's numbers) and
rolling_accuracy.png; the study writes update_strategy.json/.png.
--launcher=slurm runs each stream as a job of one SLURM array (the --slurm_*
flags of launch.sweep; streams/<i>.json in the workdir, then the table);
re-running it submits only the streams not done, queued or running.
--dry_run prints the resolved config and what would run (with --launcher=slurm:
the sbatch script) and creates nothing.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command: its first line before the imports below (JAX)
    from .starting import main
    raise SystemExit(main("fluid", __package__))

import dataclasses
import json

from absl import app, flags

from cfsl_jax.runtime import files, locks, naming
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.fluid.config import (METHODS, PRESETS, STUDY_EPOCHS, STUDY_FREQUENCIES,
                                   FluidConfig, Schedule, StreamConfig, preset)

# The library (JAX) is imported once the flags are parsed (``import_library``).
from . import cluster, config_flags, starting
from .checks import check_data_flags, check_output_dir
from .cli import flags_recorded, user_input
from .flag_types import define_list
from .options import define_backend_flags, define_data_flags, list_options, parse_options

flags.DEFINE_enum("preset", "paper", sorted(PRESETS), "Stream scale preset.")
flags.DEFINE_enum("study", None, ["update_strategy"], "Run a study instead of the table.")
flags.DEFINE_string("study_method", "finetune", "Method of the update-strategy study.")
define_list("study_frequencies", [str(u) for u in STUDY_FREQUENCIES],
            "U values (samples of a 90,000-sample sequence) of the study.", module=__name__)
define_list("study_epochs", [str(e) for e in STUDY_EPOCHS], "E values of the study.",
            module=__name__)
flags.DEFINE_bool("dry_run", False, "Print the resolved config and what would run (each "
                  "stream's state; with --launcher=slurm the sbatch script); run and create "
                  "nothing.")
flags.DEFINE_bool("list_options", False, "Print the options of each --method (type, default, "
                  "help) and exit.")
define_backend_flags()
flags.DEFINE_string("workdir", None, "Where results are written (a local path or "
                    "gs://BUCKET/PATH); required.")
FLAGS = flags.FLAGS


def pretrain_classes_flag(text: str) -> int:
    """--pretrain_classes: 'stream' -> 0 (the stream's pretrain classes only), or an int."""
    if text == "stream":
        return 0
    try:
        return int(text)
    except ValueError:
        raise UserError(f"--pretrain_classes={text!r} is neither 'stream' nor an integer (the "
                        f"number of pretraining classes)") from None


def preset_dataset_options(pairs: list[str]) -> dict:
    """--dataset_option over the preset's dataset options."""
    return {**PRESETS[FLAGS.preset]["dataset_options"], **parse_options(pairs, "dataset_option")}


# Every FluidConfig, StreamConfig and Schedule field is a flag (help and limits on the field);
# a flag left unset keeps the preset's value (an override).
_DATA = define_data_flags()
FLUID = config_flags.define(
    FluidConfig, __name__, defined=tuple(_DATA.flags),
    overrides=("num_streams", "validation_streams", "pretrain_steps", "dataset_options"),
    parsers=dict(_DATA.parsers, methods=tuple, dataset_options=preset_dataset_options,
                 method_options=lambda pairs: method_options(pairs)))
STREAM = config_flags.define(StreamConfig, __name__, overrides=True,
                             parsers=dict(pretrain_classes=pretrain_classes_flag))
SCHEDULE = config_flags.define(Schedule, __name__, overrides=("update_every",))
# The flags that set no config field (tests/test_config_flags.py checks the lists).
NOT_CONFIG = ("preset", "study", "study_method", "study_frequencies", "study_epochs",
              "dry_run", "list_options", "workdir", "download", "precision", "compilation_cache_dir")


def import_library() -> None:
    """The modules a FLUID run uses (JAX, flax, optax, matplotlib), imported once absl has
    parsed its flags, inside ``starting.importing`` (as ``launch.train``'s): a mistaken flag is
    refused in a fraction of a second. The functions below import them where they use them."""
    with starting.importing("fluid"):
        from cfsl_jax.experiments import slurm, sweep  # noqa: F401
        from cfsl_jax.fluid import experiment, methods, study  # noqa: F401


def flag_words():
    """Inside: a FluidConfig, StreamConfig or Schedule mistake names its flag."""
    return naming.field_names({**FLUID.names(), **STREAM.names(), **SCHEDULE.names()})


def method_options(pairs: list[str]) -> dict[str, dict]:
    """--method_option METHOD:NAME=VALUE strings -> {method: {name: typed value}}, checked."""
    from cfsl_jax.fluid.methods import parse_method_options
    per_method: dict[str, list[str]] = {}
    for pair in pairs:
        method, sep, rest = pair.partition(":")
        if not sep:
            raise UserError(f"--method_option={pair!r} is not METHOD:NAME=VALUE")
        if method not in METHODS:
            raise UserError(f"--method_option={pair}: unknown FLUID method {method!r}; valid: "
                            f"{', '.join(METHODS)}")
        per_method.setdefault(method, []).append(rest)
    return {method: parse_method_options(method, own, f"--method_option for {method}")
            for method, own in per_method.items()}


def config_from_flags() -> FluidConfig:
    """The flags' FluidConfig over --preset's (a mistake names its flag)."""
    base = PRESETS[FLAGS.preset]
    given = STREAM.values()
    with flag_words():
        stream = dataclasses.replace(base["stream"], **given)
        if "pretrain_classes" not in given and "num_classes" in given:
            # the preset's pretraining breadth, in stream classes (both presets: as many as the
            # stream)
            stream = dataclasses.replace(stream, pretrain_classes=round(
                base["stream"].pretrain_classes * stream.num_classes / base["stream"].num_classes))
        alone = [f for f in SCHEDULE.present() if f != "update_every"]
        if alone and FLAGS.update_every is None:
            given = " ".join(f"--{SCHEDULE.flags[f]}={FLAGS[SCHEDULE.flags[f]].value}"
                             for f in alone)
            raise UserError(f"{given} sets the schedule of --update_every: give --update_every "
                            f"too (without it each method keeps its paper schedule)")
        schedule = Schedule(**SCHEDULE.values()) if FLAGS.update_every is not None else None
        return preset(FLAGS.preset, **FLUID.values(stream=stream, schedule=schedule))


def check_stream_flags() -> None:
    """The stream flags against each other and the preset, named as typed."""
    stream = PRESETS[FLAGS.preset]["stream"]
    given = STREAM.present()
    classes = FLAGS.stream_classes if "num_classes" in given else stream.num_classes
    length = FLAGS.stream_length if "length" in given else stream.length
    if isinstance(classes, int) and classes >= 1 and length < classes:
        if "length" not in given:
            raise UserError(f"--stream_classes={classes} needs a stream of at least {classes} "
                            f"samples (one per class), but --preset={FLAGS.preset}'s is {length}: "
                            f"give --stream_length >= {classes} too")
        if "num_classes" not in given:
            raise UserError(f"--stream_length={length} is shorter than --preset={FLAGS.preset}'s "
                            f"{classes} stream classes (one sample each at least): give "
                            f"--stream_classes <= {length} too")
        raise UserError(f"--stream_classes={classes} is more than --stream_length={length}: "
                        f"every class needs at least one sample in the stream")
    limit = synthetic_split_classes()
    if limit is not None and "num_classes" in given and classes > limit:
        raise UserError(f"--stream_classes={classes} is more than the {limit} classes of "
                        f"the {FLAGS.split} split (--preset={FLAGS.preset}'s synthetic set; "
                        f"--dataset_option=num_classes=N makes it larger)")


def synthetic_split_classes() -> int | None:
    """Classes of --split in the synthetic set the flags ask for (None: another dataset)."""
    if FLAGS.dataset != "synthetic":
        return None
    from cfsl_jax.datasets.omniglot import split_class_counts
    options = {**PRESETS[FLAGS.preset]["dataset_options"],
               **parse_options(FLAGS.dataset_option, "dataset_option")}
    total = options.get("num_classes", 1623)
    return (split_class_counts(total).get(FLAGS.split) if isinstance(total, int) and total >= 3
            else None)


def check_dataset_options() -> None:
    """A real dataset's options checked before anything is created; a size option of the
    synthetic set given for one is refused, not ignored."""
    from cfsl_jax.data import SYNTHETIC_OPTIONS, check_options, check_synthetic
    if FLAGS.dataset == "synthetic":
        check_synthetic({**PRESETS[FLAGS.preset]["dataset_options"],
                         **parse_options(FLAGS.dataset_option, "dataset_option")})
        return
    for pair in FLAGS.dataset_option:
        name = pair.partition("=")[0].strip()
        if name in SYNTHETIC_OPTIONS:
            raise UserError(f"--dataset_option={pair}: {name} sizes the synthetic set only; "
                            f"--dataset={FLAGS.dataset} has its own classes and images")
    check_options(FLAGS.dataset, parse_options(FLAGS.dataset_option, "dataset_option"))


def check_pretraining_breadth(stream) -> None:
    """The stream's classes and the pretraining-only ones fit in the synthetic split."""
    limit = synthetic_split_classes()
    extra = max(stream.pretrain_classes - stream.num_pretrain, 0)
    if limit is not None and stream.num_classes + extra > limit:
        raise UserError(
            f"--pretrain_classes={FLAGS.pretrain_classes or stream.pretrain_classes} needs "
            f"{extra} pretraining-only classes besides the stream's {stream.num_classes}, but "
            f"the {FLAGS.split} split has {limit} classes (--dataset_option=num_classes=N "
            f"makes it larger; --pretrain_classes=stream pretrains on the stream's pretrain "
            f"classes only)")


def study_grid() -> tuple[list[int], list[int]]:
    """--study_frequencies and --study_epochs as integers >= 1, refused as typed."""
    grid = []
    for name in ("study_frequencies", "study_epochs"):
        values = FLAGS[name].value
        bad = [v for v in values if not (v.strip().isdigit() and int(v) >= 1)]
        if bad or not values:
            raise UserError(f"--{name}={','.join(values)}: "
                            + (f"{bad[0]} is not an integer >= 1" if bad else "give a value"))
        grid.append([int(v) for v in values])
    return grid[0], grid[1]


def check():
    """The run's FluidConfig, every flag checked (nothing is created)."""
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    study_grid()
    cluster.check_workdir()
    check_data_flags()
    check_output_dir("workdir", FLAGS.workdir)
    check_stream_flags()
    check_dataset_options()
    with user_input():
        config = config_from_flags()
    check_pretraining_breadth(config.stream)
    if FLAGS.shard is not None:
        raise UserError("--shard is for launch.sweep; launch.fluid runs its streams as SLURM "
                        "array jobs with --launcher=slurm")
    if cluster.options_from_flags() is not None and FLAGS.study:
        raise UserError("--study runs in this process: drop --launcher=slurm")
    return config


def main(argv) -> None:
    from cfsl_jax.experiments import slurm, sweep
    from cfsl_jax.fluid import study
    from cfsl_jax.fluid.methods import options_class
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.list_options:
        for name in FLAGS.method:
            print(list_options(f"options of FLUID method {name} (--method_option={name}:NAME="
                               f"VALUE)", options_class(name)))
        return
    config = check()
    slurm_options = cluster.options_from_flags()
    if FLAGS.dry_run:
        dry_run(config, slurm_options)
        return
    if slurm_options is not None:
        cluster.run_on_slurm(
            slurm.fluid_work(config, FLAGS.workdir), FLAGS.workdir, slurm_options,
            slurm.StreamJob(sweep.worker_jax_options(FLAGS.workdir)), "python -m launch.fluid",
            report=lambda final: _report(config) if all(
                item.state == "done" for item in final) else None,
            excluded=lambda: [locks.workdir_lock(FLAGS.workdir)])
        return
    if FLAGS.study == "update_strategy":
        if FLAGS.study_method not in config.method_options and FLAGS.study_method in METHODS:
            config = dataclasses.replace(config, methods=(FLAGS.study_method,), method_options={})
        with workdir_locked(), flags_recorded(FLAGS.workdir):
            cells = study.run_update_strategy(config, FLAGS.workdir, FLAGS.study_method,
                                              *study_grid())
        print(study.table(cells))
        print(f"written to {FLAGS.workdir}: update_strategy.json, update_strategy.png")
        return
    with flags_recorded(FLAGS.workdir):
        _report(config)


def dry_run(config: FluidConfig, slurm_options) -> None:
    """--dry_run: the resolved config and what the command would run; nothing is created."""
    print(f"config (--preset={FLAGS.preset} and the flags given):")
    print(json.dumps(config.to_json(), indent=2, default=str))
    if FLAGS.study:
        print(f"would run the {FLAGS.study} study of {FLAGS.study_method}: update every "
              f"{', '.join(FLAGS.study_frequencies)} samples x {', '.join(FLAGS.study_epochs)} "
              f"epochs, into {FLAGS.workdir}; nothing created")
        return
    from cfsl_jax.experiments import slurm
    works = slurm.fluid_work(config, FLAGS.workdir)
    if slurm_options is not None:
        cluster.dry_run(works, FLAGS.workdir, slurm_options)
        return
    todo = [work for work in works if work.status() != "done"]
    for work in works:
        print(f"{'done' if work not in todo else 'to run':7s} {work.name}")
    stream = config.stream
    print(f"would run {len(todo)} of {len(works)} {config.streams} stream(s) of {stream.length:,} "
          f"samples ({stream.num_classes} classes), each pretrained for "
          f"{config.pretrain_steps} steps, x {len(config.methods)} method(s): "
          f"{', '.join(config.methods)}; into {FLAGS.workdir}; nothing created")


def workdir_locked():
    """The workdir's lock, as launch.train's (``locks``): a second command that would write
    results.json, results.txt or the plots beside this one's is refused in one line."""
    return locks.workdir(FLAGS.workdir)


def _report(config) -> None:
    """Run the streams not stored yet (none after a SLURM run) and print Table 3 (the workdir
    locked: the table printed is this run's)."""
    from cfsl_jax.fluid.experiment import run_experiment
    with workdir_locked():
        results = run_experiment(config, FLAGS.workdir)
        table = files.read_text(files.join(FLAGS.workdir, "results.txt"))
    print(table)
    print(f"wall time {results['wall_seconds']:.0f} s; written to {FLAGS.workdir}: "
          f"results.json, results.txt, rolling_accuracy.png")


def run() -> None:
    from .cli import run as run_guarded  # the shared error boundary and --help (launch/cli.py)
    run_guarded(main, check=check, library=import_library)
