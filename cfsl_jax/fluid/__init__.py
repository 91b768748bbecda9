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
``report`` (table and plot), ``config`` (``FluidConfig`` and its presets),
``experiment`` (what ``launch.fluid`` runs).
"""

from cfsl_jax.fluid.methods import METHODS, FluidState, get_method
from cfsl_jax.fluid.metrics import auroc, rolling_accuracy, stream_metrics
from cfsl_jax.fluid.pretraining import pretrain_model, pretrain_split, prepare_params
from cfsl_jax.fluid.protocol import PAPER_LENGTH, Method, Schedule, StreamRecord, run_stream
from cfsl_jax.fluid.sequences import Stream, StreamClasses, StreamConfig, describe, make_stream

__all__ = [
    "METHODS", "FluidState", "get_method", "auroc", "rolling_accuracy", "stream_metrics",
    "pretrain_model", "pretrain_split", "prepare_params", "PAPER_LENGTH", "Method", "Schedule",
    "StreamRecord", "run_stream",
    "Stream", "StreamClasses", "StreamConfig", "describe", "make_stream",
]
