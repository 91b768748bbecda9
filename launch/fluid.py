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
"""

from __future__ import annotations

import dataclasses

from absl import app, flags

from cfsl_jax.experiments import slurm, sweep
from cfsl_jax.data import DATASETS
from cfsl_jax.runtime import files
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.fluid import study
from cfsl_jax.fluid.experiment import PRESETS, STREAM_KINDS, preset, run_experiment
from cfsl_jax.fluid.methods import METHODS, options_class, parse_method_options
from cfsl_jax.fluid.protocol import Schedule
from cfsl_jax.fluid.sequences import ORDERS

from . import cluster
from .checks import absolute, check_data_flags, check_output_dir
from .cli import flags_recorded
from .flag_types import define_list
from .options import define_backend_flags, define_data_flags, list_options, parse_options

flags.DEFINE_enum("preset", "paper", sorted(PRESETS), "Stream scale preset.")
flags.DEFINE_enum("study", None, ["update_strategy"], "Run a study instead of the table.")
flags.DEFINE_string("study_method", "finetune", "Method of the update-strategy study.")
define_list("study_frequencies", [str(u) for u in study.FREQUENCIES],
                  "U values (samples of a 90,000-sample sequence) of the study.")
define_list("study_epochs", [str(e) for e in study.EPOCHS], "E values of the study.")
flags.DEFINE_enum("dataset", "synthetic", DATASETS, "Dataset.")
flags.DEFINE_string("split", "train", "Split the stream and pretraining data come from.")
define_list("method", list(METHODS), f"Methods to run: {list(METHODS)}.")
flags.DEFINE_enum("streams", "test", STREAM_KINDS, "Test streams, or validation for tuning.")
flags.DEFINE_integer("num_streams", None, "Streams (default: the preset's).")
flags.DEFINE_integer("validation_streams", None, "Validation streams a 'new class' threshold "
                     "is chosen on (default: the preset's: paper 2, small 1).")
flags.DEFINE_integer("stream_classes", None, "K: classes in the stream.")
flags.DEFINE_integer("stream_length", None, "L: samples in the stream.")
flags.DEFINE_float("pretrain_fraction", None, "Fraction of the stream classes that pretrain.")
flags.DEFINE_float("zipf_s", None, "Zipf exponent of the class shares.")
flags.DEFINE_integer("head_threshold", None, "A class with more samples is a head class.")
flags.DEFINE_enum("order", None, ORDERS, "Sample order.")
flags.DEFINE_integer("min_pretrain_samples", None, "Samples per pretrain class kept out.")
flags.DEFINE_integer("max_per_class", None, "Cap on a class's stream samples (0: none).")
flags.DEFINE_string("pretrain_classes", None, "Classes of the pretraining set, the stream's "
                    "pretrain classes included (the paper: ImageNet-1K's 1,000), or 'stream': "
                    "the stream's pretrain classes only (default: the preset's).")
flags.DEFINE_integer("update_every", None, "U for every method (default: each one's, scaled).")
flags.DEFINE_integer("epochs_per_update", 4, "E, with --update_every.")
flags.DEFINE_integer("batch_size", 256, "Training minibatch, with --update_every.")
flags.DEFINE_integer("seed", 0, "Seed of every random choice.")
flags.DEFINE_integer("filters", 64, "Conv-4 width.")
flags.DEFINE_integer("pretrain_steps", None, "Pretraining steps (default: the preset's; 0: none).")
flags.DEFINE_integer("window", None, "Rolling-accuracy window (default max(10, L // 20)).")
flags.DEFINE_multi_string("method_option", [], "METHOD:NAME=VALUE (repeatable), e.g. "
                          "--method_option=ncm:metric=cosine; --list_options lists them.")
flags.DEFINE_bool("list_options", False, "Print the options of each --method (type, default, "
                  "help) and exit.")
define_data_flags()
define_backend_flags()
flags.DEFINE_string("workdir", None, "Where results are written (a local path or "
                    "gs://BUCKET/PATH); required.")

FLAGS = flags.FLAGS
_STREAM_FLAGS = {"stream_classes": "num_classes", "stream_length": "length",
                 "pretrain_fraction": "pretrain_fraction", "zipf_s": "zipf_s",
                 "head_threshold": "head_threshold", "order": "order",
                 "min_pretrain_samples": "min_pretrain_samples", "max_per_class": "max_per_class",
                 "pretrain_classes": "pretrain_classes"}
_CONFIG_FLAGS = {"method_options": "method_option"}  # FluidConfig fields named otherwise


def pretrain_classes_flag(text: str) -> int:
    """--pretrain_classes: 'stream' -> 0 (the stream's pretrain classes only), or an int."""
    if text == "stream":
        return 0
    try:
        return int(text)
    except ValueError:
        raise UserError(f"--pretrain_classes={text!r} is neither 'stream' nor an integer (the "
                        f"number of pretraining classes)") from None


def stream_flag(flag: str):
    value = getattr(FLAGS, flag)
    return pretrain_classes_flag(value) if flag == "pretrain_classes" and value is not None \
        else value


def method_options(pairs: list[str]) -> dict[str, dict]:
    """--method_option METHOD:NAME=VALUE strings -> {method: {name: typed value}}, checked."""
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


def config_from_flags():
    base = PRESETS[FLAGS.preset]
    stream = dataclasses.replace(base["stream"], **{
        field: stream_flag(flag) for flag, field in _STREAM_FLAGS.items()
        if getattr(FLAGS, flag) is not None})
    if FLAGS.pretrain_classes is None and FLAGS.stream_classes is not None:
        # the preset's pretraining breadth, in stream classes (both presets: as many as the stream)
        stream = dataclasses.replace(stream, pretrain_classes=round(
            base["stream"].pretrain_classes * stream.num_classes / base["stream"].num_classes))
    schedule = (Schedule(update_every=FLAGS.update_every,
                         epochs_per_update=FLAGS.epochs_per_update, batch_size=FLAGS.batch_size)
                if FLAGS.update_every is not None else None)
    overrides = dict(
        dataset=FLAGS.dataset, split=FLAGS.split, methods=tuple(FLAGS.method), stream=stream,
        schedule=schedule, streams=FLAGS.streams, seed=FLAGS.seed, filters=FLAGS.filters,
        window=FLAGS.window, method_options=method_options(FLAGS.method_option),
        data_dir=absolute(FLAGS.data_dir), manual_dir=absolute(FLAGS.manual_dir))
    if FLAGS.dataset_option:
        overrides["dataset_options"] = {**base["dataset_options"],
                                        **parse_options(FLAGS.dataset_option, "dataset_option")}
    for name in ("num_streams", "validation_streams", "pretrain_steps"):
        if getattr(FLAGS, name) is not None:
            overrides[name] = getattr(FLAGS, name)
    return preset(FLAGS.preset, **overrides)


def check_stream_flags() -> None:
    """The stream flags against each other and the preset, named as typed."""
    stream = PRESETS[FLAGS.preset]["stream"]
    given = {flag: getattr(FLAGS, flag) for flag in _STREAM_FLAGS if getattr(FLAGS, flag)
             is not None}
    classes = given.get("stream_classes", stream.num_classes)
    length = given.get("stream_length", stream.length)
    if isinstance(classes, int) and classes >= 1 and length < classes:
        if "stream_length" not in given:
            raise UserError(f"--stream_classes={classes} needs a stream of at least {classes} "
                            f"samples (one per class), but --preset={FLAGS.preset}'s is {length}: "
                            f"give --stream_length >= {classes} too")
        if "stream_classes" not in given:
            raise UserError(f"--stream_length={length} is shorter than --preset={FLAGS.preset}'s "
                            f"{classes} stream classes (one sample each at least): give "
                            f"--stream_classes <= {length} too")
        raise UserError(f"--stream_classes={classes} is more than --stream_length={length}: "
                        f"every class needs at least one sample in the stream")
    limit = synthetic_split_classes()
    if limit is not None and "stream_classes" in given and classes > limit:
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
    if FLAGS.dataset == "synthetic":
        return
    from cfsl_jax.data import SYNTHETIC_OPTIONS, check_options
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


def flag_words(message: str, methods: list[str] | None = None) -> str:
    """``length=5 is invalid`` -> ``--stream_length=5 is invalid``: a stream field as its flag;
    a FluidConfig field that starts the message as its flag (``num_streams must be ...`` ->
    ``--num_streams must be ...``, ``methods [...]`` -> ``--method=a,b``)."""
    import re
    fields = {field: flag for flag, field in _STREAM_FLAGS.items()}
    message = re.sub(r"(?<![-\w])(" + "|".join(fields) + r")=",  # not one already a --flag
                     lambda m: f"--{fields[m.group(1)]}=", message)
    if methods is not None:
        message = re.sub(r"^methods \[[^\]]*\]", f"--method={','.join(methods)}", message)
    return re.sub(r"^(num_streams|validation_streams|pretrain_steps|method_options)\b",
                  lambda m: f"--{_CONFIG_FLAGS.get(m.group(1), m.group(1))}", message)


def check():
    """The run's FluidConfig, every flag checked (nothing is created)."""
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    cluster.check_workdir()
    check_data_flags()
    check_output_dir("workdir", FLAGS.workdir)
    check_stream_flags()
    check_dataset_options()
    try:
        config = config_from_flags()
    except ValueError as error:  # UserError included: one line, no traceback
        raise app.UsageError(flag_words(str(error), FLAGS.method)) from error
    check_pretraining_breadth(config.stream)
    if FLAGS.shard is not None:
        raise UserError("--shard is for launch.sweep; launch.fluid runs its streams as SLURM "
                        "array jobs with --launcher=slurm")
    if cluster.options_from_flags() is not None and FLAGS.study:
        raise UserError("--study runs in this process: drop --launcher=slurm")
    return config


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.list_options:
        for name in FLAGS.method:
            print(list_options(f"options of FLUID method {name} (--method_option={name}:NAME="
                               f"VALUE)", options_class(name)))
        return
    config = check()
    slurm_options = cluster.options_from_flags()
    if slurm_options is not None:
        cluster.run_on_slurm(
            slurm.fluid_work(config, FLAGS.workdir), FLAGS.workdir, slurm_options,
            slurm.StreamJob(sweep.worker_jax_options(FLAGS.workdir)), "python -m launch.fluid",
            report=lambda final: _report(config) if all(
                item.state == "done" for item in final) else None)
        return
    if FLAGS.study == "update_strategy":
        if FLAGS.study_method not in config.method_options and FLAGS.study_method in METHODS:
            config = dataclasses.replace(config, methods=(FLAGS.study_method,), method_options={})
        with flags_recorded(FLAGS.workdir):
            cells = study.run_update_strategy(config, FLAGS.workdir, FLAGS.study_method,
                                              [int(u) for u in FLAGS.study_frequencies],
                                              [int(e) for e in FLAGS.study_epochs])
        print(study.table(cells))
        print(f"written to {FLAGS.workdir}: update_strategy.json, update_strategy.png")
        return
    with flags_recorded(FLAGS.workdir):
        _report(config)


def _report(config) -> None:
    """Run the streams not stored yet (none after a SLURM run) and print Table 3."""
    results = run_experiment(config, FLAGS.workdir)
    print(files.read_text(files.join(FLAGS.workdir, "results.txt")))
    print(f"wall time {results['wall_seconds']:.0f} s; written to {FLAGS.workdir}: "
          f"results.json, results.txt, rolling_accuracy.png")


def run() -> None:
    from .cli import run as run_guarded  # the shared error boundary and --help (launch/cli.py)
    run_guarded(main, check=check)


if __name__ == "__main__":
    run()
