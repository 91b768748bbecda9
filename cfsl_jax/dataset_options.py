"""Which datasets, splits and options there are, and each option's default: no JAX, no TFDS.

    from cfsl_jax.dataset_options import DATASETS, normalised_options
    normalised_options("synthetic", {"num_classes": 1623, "seed": 3})   # {"seed": 3}

The names and rules every config checks before anything is loaded (``cfsl_jax.data``
loads the images; ``datasets/preprocessing.py`` has the preprocessing options). Importing
this module is cheap, so a command line can check a dataset flag before JAX is imported.
"""

from __future__ import annotations

import os
from typing import Any

from cfsl_jax.datasets.preprocessing import family, with_preprocessing
from cfsl_jax.runtime.errors import UserError

DATASETS: tuple[str, ...] = ("synthetic", "omniglot", "omniglot/full", "omniglot/small",
                             "slimagenet64")
SPLITS: tuple[str, ...] = ("train", "val", "test")
SYNTHETIC_DEFAULTS: dict[str, int] = {"num_classes": 1623, "samples_per_class": 20,
                                       "image_size": 28, "seed": 0}
SYNTHETIC_OPTIONS = tuple(SYNTHETIC_DEFAULTS)
SYNTHETIC_MINIMA: dict[str, int] = {"num_classes": 3, "samples_per_class": 1, "image_size": 8}
OMNIGLOT_CLASS_SPLITS = ("ordered", "authors")


def default_data_dir() -> str:
    return os.environ.get("CFSL_DATA_DIR", os.path.expanduser("~/tensorflow_datasets"))


def option_defaults(name: str) -> dict[str, Any]:
    """The value each dataset option of ``name`` takes when it is not given, but for the
    preprocessing option (``resize``, ``normalisation``: ``datasets/preprocessing.py``), which
    a run's config.json always records (one without it ran the option's legacy value)."""
    if name == "synthetic":
        return dict(SYNTHETIC_DEFAULTS)
    if name.startswith("omniglot"):
        return {"class_split": OMNIGLOT_CLASS_SPLITS[0]}
    return {}


def normalised_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without those given at their default (``option_defaults``): an option
    given at the value it takes unset loads the same images, so configs that differ only so
    are one (compared, averaged, paired). The preprocessing option, an unknown option and a
    value of another type (``num_classes=1623.0``) are kept as given (``load_split`` and
    ``check_options`` judge them)."""
    defaults = option_defaults(name)
    return {key: value for key, value in options.items()
            if not (key in defaults and type(value) is type(defaults[key])
                    and value == defaults[key])}


def check_synthetic(options: dict) -> None:
    """The synthetic set's sizes, integers at least ``SYNTHETIC_MINIMA`` (UserError naming the
    first that is not; an unknown name: ``load_split``'s ValueError)."""
    from cfsl_jax.runtime.options import positive_int
    for option, low in SYNTHETIC_MINIMA.items():
        if option in options:
            positive_int(f"synthetic option {option}", options[option], low)


def check_options(name: str, options: dict) -> str:
    """A real dataset's ``options`` checked before anything is read (UserError naming the bad
    one); returns the preprocessing it chose (``resize`` or ``normalisation``)."""
    preprocessing = family(name)
    valid = (("class_split",) if name.startswith("omniglot") else ()) + (preprocessing.option,)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise UserError(f"unknown option(s) {unknown} for dataset {name!r}; valid: {valid}")
    chosen = with_preprocessing(name, options)[preprocessing.option]
    if chosen not in preprocessing.values:
        raise UserError(f"{preprocessing.option}={chosen!r} for dataset {name!r}; valid: "
                        f"{preprocessing.values}")
    return chosen
