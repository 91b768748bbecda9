"""Run FLUID methods on one heavy-tailed stream: results.json, results.txt, rolling_accuracy.png.

    python -m launch.fluid --workdir=/tmp/fluid                       # synthetic, all methods
    python -m launch.fluid --method=ncm,exemplar_tuning --zipf_s=1.5 --workdir=/tmp/fluid_s15
    python -m launch.fluid --dataset=omniglot --manual_dir=../shared/data/omniglot \
        --stream_classes=100 --stream_length=1000 --head_threshold=10 \
        --min_pretrain_samples=5 --workdir=/tmp/fluid_omniglot

The head threshold (50 in the paper's ImageNet-scale setting) must be scaled
down for small datasets: an Omniglot class has 20 drawings. See
``cfsl_jax/fluid/__init__.py`` for the protocol and ``fluid/experiment.py``
for what is written.
"""

from __future__ import annotations

from absl import app, flags

from cfsl_jax.data import DATASETS
from cfsl_jax.fluid.experiment import FluidConfig, run_experiment
from cfsl_jax.fluid.methods import METHODS
from cfsl_jax.fluid.protocol import Schedule
from cfsl_jax.fluid.report import table
from cfsl_jax.fluid.sequences import ORDERS, StreamConfig

from .options import define_data_flags, parse_options, quiet_third_party_logs

_CONFIG, _STREAM, _SCHEDULE = FluidConfig(), StreamConfig(), Schedule()

flags.DEFINE_enum("dataset", _CONFIG.dataset, DATASETS, "Dataset.")
flags.DEFINE_string("split", _CONFIG.split, "Split the stream and pretraining data come from.")
flags.DEFINE_list("method", list(_CONFIG.methods), f"Methods to run: {sorted(METHODS)}.")
flags.DEFINE_integer("stream_classes", _STREAM.num_classes, "K: classes in the stream.")
flags.DEFINE_integer("stream_length", _STREAM.length, "L: samples in the stream.")
flags.DEFINE_float("pretrain_fraction", _STREAM.pretrain_fraction,
                   "Fraction of the stream classes that are pretrain classes.")
flags.DEFINE_float("zipf_s", _STREAM.zipf_s, "Zipf exponent of the class shares.")
flags.DEFINE_integer("head_threshold", _STREAM.head_threshold,
                     "A class with more stream samples than this is a head class.")
flags.DEFINE_enum("order", _STREAM.order, ORDERS, "Sample order.")
flags.DEFINE_integer("min_pretrain_samples", _STREAM.min_pretrain_samples,
                     "Samples of each pretrain class kept out of the stream for pretraining.")
flags.DEFINE_integer("update_every", _SCHEDULE.update_every,
                     "U: samples between training phases of gradient-based methods.")
flags.DEFINE_integer("epochs_per_update", _SCHEDULE.epochs_per_update,
                     "E: epochs over the samples seen so far per training phase.")
flags.DEFINE_integer("batch_size", _SCHEDULE.batch_size, "Minibatch of a training step.")
flags.DEFINE_integer("seed", _CONFIG.seed, "Seed of every random choice.")
flags.DEFINE_integer("filters", _CONFIG.filters, "Conv-4 width.")
flags.DEFINE_integer("pretrain_steps", _CONFIG.pretrain_steps, "Backbone pretraining steps.")
flags.DEFINE_integer("window", None, "Rolling-accuracy window (default max(10, L // 20)).")
flags.DEFINE_multi_string("method_option", [], "METHOD:NAME=VALUE (repeatable), e.g. "
                          "--method_option=exemplar_tuning:learning_rate=0.01.")
define_data_flags()
flags.DEFINE_string("workdir", None, "Where results are written.", required=True)

FLAGS = flags.FLAGS


def method_options(pairs: list[str]) -> dict[str, dict]:
    options: dict[str, dict] = {}
    for pair in pairs:
        method, sep, rest = pair.partition(":")
        if not sep:
            raise app.UsageError(f"--method_option={pair!r} is not METHOD:NAME=VALUE")
        options.setdefault(method, {}).update(parse_options([rest], "method_option"))
    return options


def config_from_flags() -> FluidConfig:
    stream = StreamConfig(
        num_classes=FLAGS.stream_classes, length=FLAGS.stream_length,
        pretrain_fraction=FLAGS.pretrain_fraction, zipf_s=FLAGS.zipf_s,
        head_threshold=FLAGS.head_threshold, order=FLAGS.order,
        min_pretrain_samples=FLAGS.min_pretrain_samples)
    schedule = Schedule(update_every=FLAGS.update_every,
                        epochs_per_update=FLAGS.epochs_per_update, batch_size=FLAGS.batch_size)
    return FluidConfig(
        dataset=FLAGS.dataset, split=FLAGS.split, methods=tuple(FLAGS.method), stream=stream,
        schedule=schedule, seed=FLAGS.seed, filters=FLAGS.filters,
        pretrain_steps=FLAGS.pretrain_steps, window=FLAGS.window,
        dataset_options=parse_options(FLAGS.dataset_option, "dataset_option"),
        method_options=method_options(FLAGS.method_option),
        data_dir=FLAGS.data_dir, manual_dir=FLAGS.manual_dir)


def main(argv) -> None:
    quiet_third_party_logs()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        config = config_from_flags()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    results = run_experiment(config, FLAGS.workdir)
    print(f"stream: {results['stream']}")
    print(table(results["methods"]))
    print(f"written to {FLAGS.workdir}: results.json, results.txt, rolling_accuracy.png")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
