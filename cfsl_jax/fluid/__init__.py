"""FLUID: a streaming protocol beside CFSL (Wallingford et al., "In the Wild").

A learner meets a heavy-tailed stream one sample at a time: it predicts the
sample (a label among the classes seen so far plus an unseen-class score),
then the label is revealed and it may update; new classes keep appearing,
and all compute is counted.

    from cfsl_jax import data, fluid
    split = data.load_split("synthetic", "train", num_classes=100, samples_per_class=400)
    stream, classes = fluid.make_stream(key, split.class_table, split.class_sizes,
                                        fluid.StreamConfig(num_classes=50, length=2000))
    method = fluid.get_method("exemplar_tuning", num_classes=50)
    params = method.init_params(init_key, split.images[:1])
    params = fluid.pretrain_model(method, params, split, classes, pretrain_key, steps=300)
    params = fluid.prepare_params(method, params, split, classes, fisher_key)
    record = fluid.run_stream(method, params, stream, split, run_key,
                              method.schedule.scaled(2000))  # the paper's, per sample count
    fluid.stream_metrics(record.prediction, record.unseen_score, stream)  # + record.macs

Or from the command line: ``python -m launch.fluid --workdir=/tmp/fluid``.

Modules: ``sequences`` (streams), ``class_draw`` (which classes each stream of a seed
uses), ``protocol`` (``Method``, ``run_stream``, MACs),
``backbone`` (the per-image Conv-4), ``classifiers`` (class memory, detectors),
``heads`` (each method's classifier), ``methods`` (the eleven methods of the
paper's Table 3, one factory), ``pretraining`` / ``meta_pretraining`` (backbone
and head on the pretrain classes), ``metrics``,
``report`` (table and plot), ``config`` (``FluidConfig``, ``StreamConfig``, ``Schedule``,
the methods' names and the presets; no JAX),
``experiment`` (what ``launch.fluid`` runs).
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (``__getattr__``): ``fluid.config`` needs no JAX, so ``launch.fluid``
# checks its flags before JAX is imported. name -> the module that defines it.
_LAZY = {
    "METHODS": "config", "Schedule": "config", "StreamConfig": "config", "PAPER_LENGTH": "config",
    "FluidState": "methods", "get_method": "methods",
    "auroc": "metrics", "rolling_accuracy": "metrics", "stream_metrics": "metrics",
    "pretrain_model": "pretraining", "pretrain_split": "pretraining",
    "prepare_params": "pretraining",
    "Method": "protocol", "StreamRecord": "protocol", "run_stream": "protocol",
    "Stream": "sequences", "StreamClasses": "sequences", "describe": "sequences",
    "make_stream": "sequences",
}
_MODULES = ("backbone", "class_draw", "classifiers", "config", "experiment", "heads",
            "meta_pretraining", "methods", "metrics", "new_class", "pretraining", "protocol",
            "report", "run_progress", "sequences", "stream_files", "study")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if name in _MODULES:  # ``fluid.sequences`` without importing it first
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:  # the lazy names too (completion in a notebook)
    return sorted({*globals(), *_LAZY, *_MODULES})


__all__ = sorted(_LAZY)
