"""A FLUID experiment's configuration (``FluidConfig``) and its presets (``PRESETS``).

Presets (``PRESETS``): ``paper`` -- 1,000 classes (250 pretrain, 750 novel),
90,000 samples, Zipf s=1, at most 961 samples per class, head > 50, 3 test
streams (and 2 validation streams with ``--streams=validation``), pretraining
on 1,000 classes (the stream's 250 pretrain classes, each keeping >= 100
images out of the stream, and 750 pretraining-only classes: the analogue of
ImageNet-1K), on the synthetic set with 6,424 classes (4,750 in its train
split: the 1,000 pretraining classes and 750 novel classes for each of 5
streams) x 1,061 samples; ``small`` -- 40 classes (10 pretrain), 1,200
samples, head > 30, pretraining on 40 classes (257 synthetic classes, 190 in
the train split), for CPU smoke runs. ``class_draw="disjoint"``: the streams
of a seed share no novel class and the test streams no pretrain class
(``fluid.class_draw``, the paper's Appendix B). ``StreamConfig.pretrain_classes=0``
pretrains on the stream's pretrain classes only. Each
method's schedule is the paper's, scaled to the stream length
(``Schedule.scaled``; logged), unless ``schedule`` overrides it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cfsl_jax.dataset_options import DATASETS, normalised_options
from cfsl_jax.fluid import methods as fluid_methods
from cfsl_jax.fluid.class_draw import CLASS_DRAWS
from cfsl_jax.fluid.protocol import Schedule
from cfsl_jax.fluid.sequences import StreamConfig
from cfsl_jax.runtime import naming
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.runtime.options import check_limits, option

PAPER_STREAM = StreamConfig(num_classes=1000, length=90_000, pretrain_fraction=0.25, zipf_s=1.0,
                            head_threshold=50, min_pretrain_samples=100, max_per_class=961,
                            pretrain_classes=1000)
SMALL_STREAM = StreamConfig(num_classes=40, length=1200, pretrain_fraction=0.25, zipf_s=1.0,
                            head_threshold=30, min_pretrain_samples=20, pretrain_classes=40)
PRESETS = {
    # train splits of 4,750 and 190 classes: the 1,000 (40) pretraining classes and 5 streams'
    # 750 (30) novel classes, the paper's 3 test + 2 validation sequences (class_draw)
    "paper": dict(stream=PAPER_STREAM, dataset_options={"num_classes": 6424,
                                                        "samples_per_class": 1061},
                  pretrain_steps=2000, num_streams=3),
    "small": dict(stream=SMALL_STREAM, dataset_options={"num_classes": 257,
                                                        "samples_per_class": 120},
                  pretrain_steps=200, num_streams=1, validation_streams=1),
}
STREAM_KINDS = ("test", "validation")


@dataclasses.dataclass(frozen=True)
class FluidConfig:
    """One FLUID experiment. Each field carries its help and limits (``runtime.options.option``);
    ``launch.fluid`` makes a flag of each (``flag`` where it is spelled otherwise; the stream's
    and the schedule's flags are ``StreamConfig``'s and ``Schedule``'s fields)."""

    dataset: str = option("synthetic", "Dataset.", choices=DATASETS)
    split: str = option("train", "Split the stream and pretraining data come from.")
    methods: tuple[str, ...] = option(fluid_methods.METHODS, "Methods to run: "
                                      f"{list(fluid_methods.METHODS)}.", flag="method")
    stream: StreamConfig = option(PAPER_STREAM, flag=None)
    # None: each method's paper schedule, scaled to the stream
    schedule: Schedule | None = option(None, flag=None)
    num_streams: int = option(3, "Streams (default: the preset's).", minimum=1)
    streams: str = option("test", "Test streams, or validation for tuning.",
                          choices=STREAM_KINDS)
    validation_streams: int = option(2, "Validation streams a 'new class' threshold is chosen "
                                     "on (default: the preset's: paper 2, small 1).", minimum=1)
    class_draw: str = option("disjoint", "Classes of the streams: disjoint (the paper: no novel "
                             "class in two streams, no pretrain class in two test streams; one "
                             "pretraining world per seed) or independent (each stream draws its "
                             "own).", choices=CLASS_DRAWS)
    seed: int = option(0, "Seed of every random choice.")
    filters: int = option(64, "Conv-4 width.", minimum=1)  # shared by every method
    pretrain_steps: int = option(2000, "Pretraining steps (default: the preset's; 0: none).",
                                 minimum=0)
    pretrain_batch: int = option(64, "Images per pretraining step.", minimum=1)
    pretrain_learning_rate: float = option(1e-3, "Pretraining (Adam) learning rate.", above=0)
    window: int | None = option(None, "Rolling-accuracy window (default max(10, L // 20)).",
                                minimum=1)
    dataset_options: dict = option(
        help="Dataset options.", flag="dataset_option",
        factory=lambda: dict(PRESETS["paper"]["dataset_options"]))
    method_options: dict = option(  # {method: {option: value}}
        help="METHOD:NAME=VALUE (repeatable), e.g. --method_option=ncm:metric=cosine; "
        "--list_options lists them.", flag="method_option", factory=dict)
    data_dir: str | None = option(None, "Where prepared TFDS datasets live.")
    manual_dir: str | None = option(None, "Folder with the official archives.")

    def __post_init__(self):
        def name(field: str) -> str:
            return naming.name("FluidConfig", field, qualified=False)
        unknown = [m for m in self.methods if m not in fluid_methods.METHODS]
        if not self.methods or unknown:
            raise UserError(f"{name('methods')}={','.join(self.methods)}: unknown "
                            f"{', '.join(unknown)}; valid: {', '.join(fluid_methods.METHODS)}")
        extra = sorted(set(self.method_options) - set(self.methods))
        if extra:
            raise UserError(f"{name('method_options')} for methods not run: {extra}")
        check_limits(self, qualified=False)
        # an option given at its default is the option unset (normalised_options)
        if isinstance(self.dataset_options, dict):
            object.__setattr__(self, "dataset_options",
                               normalised_options(self.dataset, self.dataset_options))
        for method, options in self.method_options.items():
            if options.get("new_class_threshold") is not None and not options.get("new_class"):
                raise UserError(f"method {method}: new_class_threshold="
                                f"{options['new_class_threshold']} needs new_class=true")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def comparable(saved: dict[str, Any]) -> dict[str, Any]:
    """A stored ``to_json`` (results.json's, a stream file's ``config``) as today's writes it: its
    dataset options normalised (``dataset_options.normalised_options``), so a run saved with an
    option given at its default is the same configuration as one without it."""
    options = saved.get("dataset_options")
    if not isinstance(options, dict):
        return dict(saved)
    return {**saved, "dataset_options": normalised_options(
        saved.get("dataset", FluidConfig.dataset), options)}


def preset(name: str, **overrides) -> FluidConfig:
    """``FluidConfig`` of preset ``name`` (``PRESETS``) with ``overrides``."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; valid: {sorted(PRESETS)}")
    return FluidConfig(**{**PRESETS[name], **overrides})
