"""FLUID stream throughput at the paper's scale: seconds per 90,000-sample stream per method.

    python benchmarks/fluid_throughput.py                           # NCM + ET, paper scale, CPU
    python benchmarks/fluid_throughput.py --methods=ncm --preset=small --repeats=3

The stream is the ``paper`` preset's (1,000 classes, 250 pretrain, 90,000
samples, Zipf s=1, <= 961 per class) on the synthetic set (2,367 classes x
1,061 samples, 28x28), or the ``small`` preset's. A 64-filter Conv-4 with
random weights (throughput does not depend on them; no pretraining, so no
class is known). A run is ``fluid.run_stream`` end to end with each method's
paper schedule scaled to the stream (Exemplar Tuning: 4 epochs every 5,000
samples, batch 256), without MAC counting. The first run includes
compilation; the figure is the median of the next --repeats runs. The JSON
also gives the process's CPU seconds and the load average: on a shared
machine (load above the core count) wall seconds overstate the cost, and CPU
seconds / cores estimates the wall time on an idle machine. Targets
(CPU, 2 cores, after compilation): NCM <= 60 s, Exemplar Tuning <= 300 s.
Prints a table, then one JSON line per method.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from cfsl_jax import fluid
from cfsl_jax.fluid import experiment

_METHODS = flags.DEFINE_list("methods", ["ncm", "exemplar_tuning"], "Methods to measure.")
_PRESET = flags.DEFINE_enum("preset", "paper", sorted(experiment.PRESETS), "Stream preset.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Timed runs after the first (median).")
TARGETS = {"ncm": 60.0, "exemplar_tuning": 300.0}  # seconds, paper preset, CPU


def main(argv) -> None:
    del argv
    config = experiment.preset(_PRESET.value, methods=tuple(_METHODS.value))
    started = time.perf_counter()
    split = experiment.load(config)
    load_seconds = time.perf_counter() - started
    stream, _ = fluid.make_stream(experiment.stream_key(config, 0), split.class_table,
                                  split.class_sizes, config.stream)
    image_shape = tuple(split.images.shape[1:])
    rows = []
    for name in _METHODS.value:
        method = fluid.get_method(name, config.stream.num_classes, image_shape)
        params = method.init_params(jax.random.key(1), jnp.zeros((1, *image_shape)))
        schedule = experiment.schedule_for(method, config)
        first = fluid.run_stream(method, params, stream, split, jax.random.key(2), schedule,
                                 count_macs=False)
        times, cpu = [], []
        for _ in range(_REPEATS.value):
            start, start_cpu = time.perf_counter(), time.process_time()
            record = fluid.run_stream(method, params, stream, split, jax.random.key(2), schedule,
                                      count_macs=False)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        seconds = statistics.median(times)
        cpu_seconds = statistics.median(cpu)
        length = config.stream.length
        target = TARGETS.get(name) if _PRESET.value == "paper" else None
        row = dict(benchmark="fluid_throughput", method=name, preset=_PRESET.value,
                   length=length, classes=config.stream.num_classes,
                   schedule=schedule.describe() if schedule else None,
                   train_steps=record.train_steps, samples_per_s=round(length / seconds, 1),
                   seconds=round(seconds, 2), first_run_seconds=round(first.seconds, 2),
                   process_cpu_seconds=round(cpu_seconds, 1), load_average=os.getloadavg()[0],
                   target_seconds=target,
                   meets_target=None if target is None else seconds <= target,
                   dataset_seconds=round(load_seconds, 1),
                   backend=jax.default_backend(), devices=jax.device_count())
        rows.append(row)
        print(f"{name:16s} {row['samples_per_s']:>9,.0f} samples/s  ({seconds:.1f} s for "
              f"{length} samples, {record.train_steps} training steps; first run "
              f"{first.seconds:.1f} s; target {target} s)", file=sys.stderr)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    app.run(main)
