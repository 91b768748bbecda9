"""FLUID stream throughput: samples/second of NCM and Exemplar Tuning on a synthetic stream.

    python benchmarks/fluid_throughput.py                      # 10,000 samples, CPU
    python benchmarks/fluid_throughput.py --methods=ncm --length=2000 --repeats=3

A 64-filter Conv-4 (random weights: throughput does not depend on them) on
28x28 synthetic glyphs; the stream has --classes classes, Zipf s=1, drawn
from a synthetic split of --dataset_classes x --samples_per_class. A run is
``fluid.run_stream`` end to end (predict, update, and for Exemplar Tuning a
training phase of E epochs every U samples, the schedule flags) without MAC
counting. The first run includes compilation; the figure is the median of
the next --repeats runs (the compiled programs are cached per method).
Prints a table, then one JSON line per method.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from cfsl_jax import data, fluid

_METHODS = flags.DEFINE_list("methods", ["ncm", "exemplar_tuning"], "Methods to measure.")
_LENGTH = flags.DEFINE_integer("length", 10_000, "Samples in the stream.")
_CLASSES = flags.DEFINE_integer("classes", 100, "Classes in the stream.")
_DATASET_CLASSES = flags.DEFINE_integer("dataset_classes", 200,
                                        "Synthetic classes generated (the train split is ~74%).")
_SAMPLES = flags.DEFINE_integer("samples_per_class", 400, "Synthetic samples per class.")
_UPDATE_EVERY = flags.DEFINE_integer("update_every", 100, "U (gradient-based methods).")
_EPOCHS = flags.DEFINE_integer("epochs_per_update", 1, "E (gradient-based methods).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Training minibatch.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Timed runs after the first (median).")


def main(argv) -> None:
    del argv
    split = data.load_split("synthetic", "train", num_classes=_DATASET_CLASSES.value,
                            samples_per_class=_SAMPLES.value, image_size=28)
    config = fluid.StreamConfig(num_classes=_CLASSES.value, length=_LENGTH.value)
    stream, _ = fluid.make_stream(jax.random.key(0), split.class_table, split.class_sizes,
                                  config)
    schedule = fluid.Schedule(update_every=_UPDATE_EVERY.value,
                              epochs_per_update=_EPOCHS.value, batch_size=_BATCH.value)
    rows = []
    for name in _METHODS.value:
        method = fluid.get_method(name, _CLASSES.value)
        params = method.init_params(jax.random.key(1), jnp.zeros((1, 28, 28, 1)))
        first = fluid.run_stream(method, params, stream, split, jax.random.key(2), schedule,
                                 count_macs=False)
        times = []
        for _ in range(_REPEATS.value):
            start = time.perf_counter()
            record = fluid.run_stream(method, params, stream, split, jax.random.key(2), schedule,
                                      count_macs=False)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        row = dict(benchmark="fluid_throughput", method=name, length=_LENGTH.value,
                   classes=_CLASSES.value, update_every=schedule.update_every,
                   epochs_per_update=schedule.epochs_per_update, batch_size=schedule.batch_size,
                   train_steps=record.train_steps,
                   samples_per_s=round(_LENGTH.value / seconds, 1),
                   seconds=round(seconds, 2), first_run_seconds=round(first.seconds, 2),
                   backend=jax.default_backend(), devices=jax.device_count())
        rows.append(row)
        print(f"{name:16s} {row['samples_per_s']:>9,.0f} samples/s  ({seconds:.2f} s for "
              f"{_LENGTH.value} samples, {record.train_steps} training steps; first run "
              f"{first.seconds:.2f} s)", file=sys.stderr)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    app.run(main)
