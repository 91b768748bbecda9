"""A FLUID experiment's configuration (``FluidConfig``), its parts (``StreamConfig``: what
stream; ``Schedule``: when gradient-based methods train), the methods' names and the presets
(``PRESETS``). No JAX: ``launch.fluid`` defines its flags from these and checks them before it
imports JAX (``fluid.sequences`` and ``fluid.protocol`` import ``StreamConfig`` and
``Schedule`` from here).

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
import math
from typing import Any

import numpy as np

from cfsl_jax.dataset_options import DATASETS, SPLITS, normalised_options
from cfsl_jax.runtime import naming
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.runtime.options import check_limits, option, positive_int

# The methods of the paper's Table 3, in its order (``fluid.methods.SPECS`` builds each).
METHODS: tuple[str, ...] = ("ncm", "exemplar_tuning", "imprinting", "finetune", "standard",
                            "lwf", "ewc", "protonets", "meta_baseline", "maml", "oltr")
CLASS_DRAWS = ("disjoint", "independent")  # FluidConfig.class_draw (fluid.class_draw)
PAPER_LENGTH = 90_000  # samples in one of the paper's sequences (Table 4: 86,988-90,133)
# The update-strategy study's grid (fluid.study): U, in samples of a 90,000-sample sequence,
# and E, epochs per phase.
STUDY_FREQUENCIES = (1000, 2500, 5000, 10000, 20000)
STUDY_EPOCHS = (2, 4, 8, 16)

ORDERS = ("uniform", "staggered")


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """What stream to build (validated on construction)."""

    # Each field's help is its flag's (launch.fluid; ``flag`` where it is spelled otherwise).
    num_classes: int = option(50, "K: classes in the stream.", flag="stream_classes")
    length: int = option(2000, "L: samples in the stream.", flag="stream_length")
    # P = round(K * pretrain_fraction) pretrain classes
    pretrain_fraction: float = option(0.5, "Fraction of the stream classes that pretrain.")
    zipf_s: float = option(1.0, "Zipf exponent of the class shares.")  # 0 = uniform
    head_threshold: int = option(50, "A class with more samples is a head class.")
    # "uniform" | "staggered" (classes first appear over time)
    order: str = option("uniform", "Sample order.", choices=ORDERS)
    min_pretrain_samples: int = option(10, "Samples per pretrain class kept out.")
    max_per_class: int = option(0, "Cap on a class's stream samples (0: none).")  # paper: 961
    # N > 0: pretraining set of N classes, the P stream ones included
    pretrain_classes: int = option(
        0, "Classes of the pretraining set, the stream's pretrain classes included (the paper: "
        "ImageNet-1K's 1,000), or 'stream': the stream's pretrain classes only (default: the "
        "preset's).")

    def __post_init__(self):
        def check(name, ok, limit):
            if not ok:
                raise ValueError(f"{naming.name('StreamConfig', name, qualified=False)}="
                                 f"{getattr(self, name)!r} is invalid: must be {limit}")

        check("num_classes", _is_int(self.num_classes) and self.num_classes >= 1, "an int >= 1")
        check("length", _is_int(self.length) and self.length >= self.num_classes,
              f"an int >= num_classes ({self.num_classes}): every class appears at least once")
        check("pretrain_fraction", 0.0 <= self.pretrain_fraction <= 1.0, "in [0, 1]")
        check("zipf_s", 0.0 <= self.zipf_s < 100, "in [0, 100)")
        check("head_threshold", _is_int(self.head_threshold) and self.head_threshold >= 0,
              "an int >= 0")
        check("order", self.order in ORDERS, f"one of {ORDERS}")
        check("max_per_class", _is_int(self.max_per_class) and self.max_per_class >= 0,
              "an int >= 0 (0: no cap)")
        check("min_pretrain_samples",
              _is_int(self.min_pretrain_samples) and self.min_pretrain_samples >= 0, "an int >= 0")
        check("pretrain_classes", _is_int(self.pretrain_classes) and (
            self.pretrain_classes == 0 or self.pretrain_classes >= self.num_pretrain),
            f"0 (the stream's pretrain classes only) or an int >= the stream's "
            f"{self.num_pretrain} pretrain classes")

    @property
    def num_pretrain(self) -> int:
        """P: pretrain classes (round half to even, as Python's round)."""
        return int(round(self.num_classes * self.pretrain_fraction))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)



@dataclasses.dataclass(frozen=True)
class Schedule:
    """When and how gradient-based methods train, in samples (ignored by instance-based ones).

    Defaults: the paper's offline training (Appendix E): 4 epochs every 5,000
    samples, minibatches of 256 (the authors' ``offline_batch_size``).
    """

    # U: a phase after every U samples (from ``start`` on); the flags are launch.fluid's
    update_every: int = option(5000, "U for every method (default: each one's, scaled).")
    # E: epochs over the samples seen so far per phase
    epochs_per_update: int = option(4, "E, with --update_every.")
    batch_size: int = option(256, "Training minibatch, with --update_every.")
    # no regular phase before this many samples (Weight Imprinting: 10,000)
    start: int = option(0, flag=None)
    warmup_every: int = option(0, flag=None)  # > 0: also a phase every this many samples ...
    # ... up to this many samples (OLTR: every 200 up to 10,000)
    warmup_until: int = option(0, flag=None)

    def __post_init__(self):
        for name in ("update_every", "epochs_per_update", "batch_size"):
            positive_int(naming.name("Schedule", name, qualified=False), getattr(self, name), 1)
        for name in ("start", "warmup_every", "warmup_until"):
            positive_int(name, getattr(self, name), 0)

    def steps(self, seen: int) -> int:
        """Training steps of one phase after ``seen`` samples: E * ceil(seen / batch_size)."""
        return self.epochs_per_update * math.ceil(seen / self.batch_size)

    def phase_ends(self, length: int) -> list[int]:
        """Sample counts t < ``length`` after which a phase runs, ascending."""
        ends = {t for t in range(self.update_every, length, self.update_every) if t >= self.start}
        if self.warmup_every:
            ends |= set(range(self.warmup_every, min(self.warmup_until, length - 1) + 1,
                              self.warmup_every))
        return sorted(t for t in ends if 0 < t < length)

    def scaled(self, length: int, reference: int = PAPER_LENGTH) -> "Schedule":
        """Every sample count times ``length / reference`` (rounded; intervals >= 1)."""
        factor = length / reference

        def scale(value: int, low: int) -> int:
            return max(low, int(round(value * factor))) if value else 0

        return dataclasses.replace(
            self, update_every=scale(self.update_every, 1), start=scale(self.start, 0),
            warmup_every=scale(self.warmup_every, 1), warmup_until=scale(self.warmup_until, 0))

    def describe(self) -> str:
        text = f"{self.epochs_per_update} epochs every {self.update_every} samples"
        if self.start:
            text += f" from {self.start}"
        if self.warmup_every:
            text += f" (and every {self.warmup_every} up to {self.warmup_until})"
        return text + f", batch {self.batch_size}"



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
    split: str = option("train", "Split the stream and pretraining data come from.",
                        choices=SPLITS)
    methods: tuple[str, ...] = option(METHODS, "Methods to run: "
                                      f"{list(METHODS)}.", flag="method")
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
    data_dir: str | None = option(None, "Where prepared TFDS datasets live (default: "
                                   "$CFSL_DATA_DIR, else ~/tensorflow_datasets).")
    manual_dir: str | None = option(None, "Folder with the official archives.")

    def __post_init__(self):
        def name(field: str) -> str:
            return naming.name("FluidConfig", field, qualified=False)
        unknown = [m for m in self.methods if m not in METHODS]
        if not self.methods or unknown:
            raise UserError(f"{name('methods')}={','.join(self.methods)}: unknown "
                            f"{', '.join(unknown)}; valid: {', '.join(METHODS)}")
        extra = sorted(set(self.method_options) - set(self.methods))
        if extra:
            raise UserError(f"{name('method_options')} for methods not run: {extra}")
        check_limits(self, qualified=False)
        if ("ewc" in self.methods and isinstance(self.stream, StreamConfig)
                and self.stream.num_pretrain == 0):
            raise UserError(f"method ewc needs pretrain classes (its Fisher is measured on "
                            f"their images kept out of the stream): pretrain_fraction="
                            f"{self.stream.pretrain_fraction} gives none of the "
                            f"{self.stream.num_classes} stream classes; raise it, or leave ewc "
                            f"out")
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
