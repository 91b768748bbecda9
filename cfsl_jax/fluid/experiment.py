"""One FLUID experiment: build the stream, pretrain the shared backbone, run every method.

``run_experiment(config, workdir)`` writes into ``workdir``:
``results.json`` (config, dataset, stream statistics, and per method: metrics,
MACs, training steps, seconds), ``results.txt`` (the printed table) and
``rolling_accuracy.png``; it returns the results dict.

Keys (``seeding.purpose_key``): "data" builds the stream, "init" the backbone,
"pretrain" pretrains it, "train" drives each method's stream (its state init
and minibatch shuffles) -- the same for every method.

Datasets: ``synthetic`` (built in memory; ``dataset_options`` default to 100
classes x 400 samples, whose train split has 74 classes) and ``omniglot*``.
On Omniglot the pretrain and novel classes come from disjoint alphabets:
alphabets are taken in the split's class order (background before evaluation
alphabets) into the pretrain pool while it holds at most
``pretrain_fraction`` of the split's classes (at least one alphabet); with the
full Omniglot zips and a fraction near 0.8 that is the background alphabets.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

import cfsl_jax
from cfsl_jax import data, results as results_io, seeding
from cfsl_jax.fluid import methods as fluid_methods
from cfsl_jax.fluid import report
from cfsl_jax.fluid.metrics import rolling_accuracy, stream_metrics
from cfsl_jax.fluid.pretraining import pretrain_backbone
from cfsl_jax.fluid.protocol import Schedule, run_stream
from cfsl_jax.fluid.sequences import StreamConfig, describe, make_stream

SYNTHETIC_DEFAULTS = {"num_classes": 100, "samples_per_class": 400}


@dataclasses.dataclass(frozen=True)
class FluidConfig:
    dataset: str = "synthetic"
    split: str = "train"
    methods: tuple[str, ...] = ("ncm", "exemplar_tuning", "imprinting", "finetune", "standard")
    stream: StreamConfig = StreamConfig()
    schedule: Schedule = Schedule()
    seed: int = 0
    filters: int = 64  # Conv-4 width, shared by every method
    pretrain_steps: int = 300
    pretrain_batch: int = 64
    pretrain_learning_rate: float = 1e-3
    window: int | None = None  # rolling-accuracy window; None: max(10, L // 20)
    dataset_options: dict = dataclasses.field(default_factory=dict)
    method_options: dict = dataclasses.field(default_factory=dict)  # {method: {option: value}}
    data_dir: str | None = None
    manual_dir: str | None = None

    def __post_init__(self):
        unknown = [m for m in self.methods if m not in fluid_methods.METHODS]
        if not self.methods or unknown:
            raise ValueError(f"methods {list(self.methods)}: unknown {unknown}; "
                             f"valid: {sorted(fluid_methods.METHODS)}")
        extra = sorted(set(self.method_options) - set(self.methods))
        if extra:
            raise ValueError(f"method_options for methods not run: {extra}")
        if self.dataset not in data.DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; valid: {data.DATASETS}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def alphabet_pretrain_mask(class_names: tuple[str, ...], fraction: float) -> np.ndarray:
    """bool [C]: classes of the leading alphabets (module doc) -- Omniglot's pretrain pool."""
    alphabets = [name.split("/")[0] for name in class_names]
    order = list(dict.fromkeys(alphabets))  # first-appearance order
    sizes = {a: alphabets.count(a) for a in order}
    chosen, total = [], 0
    for alphabet in order:
        if chosen and total + sizes[alphabet] > fraction * len(class_names):
            break
        chosen.append(alphabet)
        total += sizes[alphabet]
    return np.array([a in chosen for a in alphabets])


def load(config: FluidConfig) -> data.Split:
    options = dict(config.dataset_options)
    if config.dataset == "synthetic":
        options = {**SYNTHETIC_DEFAULTS, "image_size": 28, **options}
    return data.load_split(config.dataset, config.split, data_dir=config.data_dir,
                           manual_dir=config.manual_dir, **options)


def run_experiment(config: FluidConfig, workdir: str) -> dict[str, Any]:
    """Run every method of ``config`` on one stream; write and return the results."""
    os.makedirs(workdir, exist_ok=True)
    split = load(config)
    mask = (alphabet_pretrain_mask(split.info.class_names, config.stream.pretrain_fraction)
            if config.dataset.startswith("omniglot") else None)
    stream, classes = make_stream(seeding.purpose_key(config.seed, "data"), split.class_table,
                                  split.class_sizes, config.stream, pretrain_mask=mask)
    stats = describe(stream, classes)
    logging.info("stream: %s", stats)
    image_shape = tuple(split.images.shape[1:])
    k = config.stream.num_classes
    built = {name: fluid_methods.get_method(name, k, image_shape, filters=config.filters,
                                            **config.method_options.get(name, {}))
             for name in config.methods}

    first = built[config.methods[0]]  # every method has the same backbone architecture
    params = first.init_params(seeding.purpose_key(config.seed, "init"),
                               jnp.zeros((1, *image_shape), jnp.float32))
    started = time.perf_counter()
    params = pretrain_backbone(first, params, split, classes,
                               seeding.purpose_key(config.seed, "pretrain"),
                               steps=config.pretrain_steps, batch_size=config.pretrain_batch,
                               learning_rate=config.pretrain_learning_rate,
                               log_every=max(1, config.pretrain_steps // 5))
    pretrain_seconds = time.perf_counter() - started

    per_method, curves, window = {}, {}, None
    for name, method in built.items():
        record = run_stream(method, params, stream, split,
                            seeding.purpose_key(config.seed, "train"), config.schedule)
        result = stream_metrics(record.prediction, record.unseen_score, stream, config.window)
        window = result["rolling_window"]
        curves[name] = rolling_accuracy(record.prediction == np.asarray(stream.label), window)
        per_method[name] = {"detector": method.detector, "metrics": result, "macs": record.macs,
                            "train_steps": record.train_steps, "seconds": record.seconds}
        logging.info("%s: accuracy %.4f auroc %s (%.1f s)", name, result["accuracy"],
                     result["auroc"], record.seconds)

    results = {
        "config": config.to_json(),
        "dataset": {"name": split.info.dataset, "split": split.info.split,
                    "num_classes": split.info.num_classes, "num_images": split.info.num_images,
                    "source": split.info.source},
        "stream": stats,
        "pretrain_seconds": pretrain_seconds,
        "methods": per_method,
        "versions": {"cfsl_jax": cfsl_jax.__version__, "jax": jax.__version__,
                     "backend": jax.default_backend()},
    }
    results_io.write_json(os.path.join(workdir, "results.json"), results)
    text = report.table(per_method)
    with open(os.path.join(workdir, "results.txt"), "w") as f:
        f.write(text + "\n")
    report.plot_rolling_accuracy(curves, window, os.path.join(workdir, "rolling_accuracy.png"),
                                 title=f"FLUID on {split.info.dataset}: rolling accuracy")
    return results
