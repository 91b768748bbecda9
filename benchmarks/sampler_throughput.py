"""Sampler throughput: tasks/second for index sampling and for sampling + image gathering.

    python benchmarks/sampler_throughput.py            # B10, A10, D8 on mini-Omniglot and synthetic
    python benchmarks/sampler_throughput.py --cells=B10 --datasets=synthetic --repeats=10

(a) ``sample_tasks`` over --index_batch keys (indices only); (b) sampling and
gathering every support and target image as normalised float32, over
--image_batch keys. Both are one jitted program; the figure is the median over
--repeats runs after compilation. Prints a table, one JSON line per
measurement, and the ratio to the targets of the foundation issue (B10 on the
synthetic set: 10,000 tasks/s for (a), 1,000 tasks/s for (b); the paper's
PyTorch data provider makes about 150 tasks/s with images).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app, flags
import jax
import numpy as np

from cfsl_jax import data
from cfsl_jax.protocol.sampler import sample_task, sample_tasks
from cfsl_jax.protocol.spec import TaskSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OMNIGLOT_DIR = os.path.join(REPO, "..", "shared", "data", "omniglot")
TARGETS = {"index": 10_000, "images": 1_000}  # B10, synthetic, tasks/s
PYTORCH_IMAGES = 150  # the paper's data provider, tasks/s with images, B10

_CELLS = flags.DEFINE_list("cells", ["B10", "A10", "D8"], "Task cells to measure.")
_DATASETS = flags.DEFINE_list("datasets", ["omniglot", "synthetic"], "Datasets (train split).")
_INDEX_BATCH = flags.DEFINE_integer("index_batch", 1024, "Keys per call for (a).")
_IMAGE_BATCH = flags.DEFINE_integer("image_batch", 64, "Keys per call for (b).")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed runs after compilation (median).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where prepared TFDS datasets live.")


def _median_seconds(fn, *args) -> tuple[float, float]:
    """(compile+first run seconds, median seconds of the next runs)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def _images_fn(spec: TaskSpec):
    @jax.jit
    def sample_and_gather(keys, split):
        def one(key):
            task = sample_task(key, split.class_table, split.class_sizes, spec)
            return (data.gather_normalised(split, task.support_idx), task.support_labels,
                    data.gather_normalised(split, task.target_idx), task.target_labels)
        return jax.vmap(one)(keys)
    return sample_and_gather


def main(argv) -> None:
    del argv
    results = []
    for dataset in _DATASETS.value:
        manual_dir = OMNIGLOT_DIR if dataset == "omniglot" else None
        split = data.load_split(dataset, "train", data_dir=_DATA_DIR.value, manual_dir=manual_dir)
        for cell in _CELLS.value:
            spec = TaskSpec.parse(cell)
            key = jax.random.key(0)
            index_keys = jax.random.split(key, _INDEX_BATCH.value)
            image_keys = jax.random.split(key, _IMAGE_BATCH.value)
            sample_tasks(index_keys, split.class_table, split.class_sizes, spec)  # validates
            measures = {
                "index": (_INDEX_BATCH.value, lambda k: sample_tasks(
                    k, split.class_table, split.class_sizes, spec), index_keys),
                "images": (_IMAGE_BATCH.value, lambda k, f=_images_fn(spec): f(k, split),
                           image_keys),
            }
            for kind, (batch, fn, keys) in measures.items():
                first, seconds = _median_seconds(fn, keys)
                row = dict(benchmark="sampler_throughput", dataset=dataset,
                           classes=int(split.class_table.shape[0]), cell=cell, kind=kind,
                           batch=batch, tasks_per_s=round(batch / seconds, 1),
                           compile_s=round(first - seconds, 3), backend=jax.default_backend(),
                           devices=jax.device_count())
                if dataset == "synthetic" and cell == "B10":
                    row["target_tasks_per_s"] = TARGETS[kind]
                    row["ratio_to_target"] = round(row["tasks_per_s"] / TARGETS[kind], 2)
                if kind == "images" and cell == "B10":
                    row["ratio_to_pytorch"] = round(row["tasks_per_s"] / PYTORCH_IMAGES, 1)
                results.append(row)
                print(f"{dataset:10s} {cell:4s} {kind:6s} {row['tasks_per_s']:>10,.0f} tasks/s"
                      f"  (batch {batch}, compile {row['compile_s']:.2f}s)"
                      + (f"  ratio to target {row['ratio_to_target']}"
                         if "ratio_to_target" in row else ""), file=sys.stderr)
    for row in results:
        print(json.dumps(row))


if __name__ == "__main__":
    app.run(main)
