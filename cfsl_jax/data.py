"""Splits as device arrays: images, a padded class table, class sizes.

    split = load_split("omniglot", "train", manual_dir="../shared/data/omniglot")
    split.images        # uint8 [N, H, W, C] on device
    split.class_table   # int32 [C, S]: row c = indices into images of class c, padded with -1
    split.class_sizes   # int32 [C]
    x = gather_normalised(split, task.support_idx)   # float32 [..., H, W, C] in [0, 1], in jit

Datasets (``DATASETS``):
- ``synthetic``: procedurally generated glyph classes (``datasets/synthetic.py``),
  built in memory (no disk, 1-3 s on 2 cores); options ``num_classes`` (1623),
  ``samples_per_class`` (20), ``image_size`` (28), ``seed`` (0). Class split
  rule as Omniglot's (1623 -> 1200/211/212).
- ``omniglot`` (``omniglot/full``, ``omniglot/small``): the TFDS builder
  ``cfsl_omniglot`` prepared from the official zips in ``manual_dir``. Plain
  ``omniglot`` picks ``full`` if both full zips are in ``manual_dir``, else
  ``small`` if both small zips are, else a config already prepared in
  ``data_dir`` (full first), else asks for the full zips.
- ``slimagenet64``: the TFDS builder ``cfsl_slimagenet64`` prepared from
  ``SlimageNet64.tar.bz2`` in ``manual_dir``; its own train/val/test split.

TFDS datasets are written as ``array_record`` into ``data_dir`` (default
``$CFSL_DATA_DIR`` or ``~/tensorflow_datasets``) on first use and read back
with the TFDS data source API (no TensorFlow). Records are ordered by
(label, drawing), so the class table is the same on every machine.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

DATASETS: tuple[str, ...] = ("synthetic", "omniglot", "omniglot/full", "omniglot/small",
                             "slimagenet64")
SPLITS: tuple[str, ...] = ("train", "val", "test")
_SYNTHETIC_OPTIONS = ("num_classes", "samples_per_class", "image_size", "seed")
_READ_CHUNK = 4096  # records decoded per data-source call


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """What a split is, for reports (static: not a pytree leaf)."""

    dataset: str
    split: str
    num_classes: int
    num_images: int
    image_shape: tuple[int, ...]
    class_names: tuple[str, ...]
    source: str


@flax.struct.dataclass
class Split:
    """One class split of a dataset, on device."""

    images: jax.Array  # uint8 [N, H, W, C]
    class_table: jax.Array  # int32 [C, S] image indices of each class, padded with -1
    class_sizes: jax.Array  # int32 [C] valid entries of each row
    info: SplitInfo = flax.struct.field(pytree_node=False)


def gather_normalised(split_or_images: Split | jax.Array, indices: jax.Array) -> jax.Array:
    """Images at ``indices`` (any shape) as float32 in [0, 1]; works inside jit."""
    images = split_or_images.images if isinstance(split_or_images, Split) else split_or_images
    return images[indices].astype(jnp.float32) / 255.0


def default_data_dir() -> str:
    return os.environ.get("CFSL_DATA_DIR", os.path.expanduser("~/tensorflow_datasets"))


def load_split(name: str, split: str, data_dir: str | None = None,
               manual_dir: str | None = None, **options: Any) -> Split:
    """Load (preparing on first use) one split of dataset ``name`` onto the device.

    Args:
      name: one of ``DATASETS``.
      split: one of ``SPLITS``.
      data_dir: where TFDS datasets are prepared and read (default ``$CFSL_DATA_DIR`` or
        ``~/tensorflow_datasets``); unused by ``synthetic``.
      manual_dir: the folder holding the raw archives (TFDS ``manual_dir``); needed only
        to prepare. Without it TFDS's ``<data_dir>/downloads/manual`` is used, and for
        Omniglot the zips are downloaded if they are not there.
      **options: ``synthetic`` only: ``num_classes``, ``samples_per_class``,
        ``image_size``, ``seed``.

    Raises:
      ValueError: an unknown name, split or option (the message lists the valid ones).
      cfsl_jax.datasets.errors.DatasetNotFoundError: the raw files are missing.
      cfsl_jax.datasets.errors.CorruptDatasetError: the raw files are corrupt or incomplete.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid: {DATASETS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {SPLITS}")
    if name == "synthetic":
        unknown = sorted(set(options) - set(_SYNTHETIC_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for dataset 'synthetic'; "
                             f"valid: {_SYNTHETIC_OPTIONS}")
        images, labels, names, source = _synthetic(split, **options)
    else:
        if options:
            raise ValueError(f"dataset {name!r} takes no options, got {sorted(options)}")
        data_dir = os.path.abspath(data_dir or default_data_dir())
        manual_dir = os.path.abspath(manual_dir) if manual_dir else None
        images, labels, names, source = _tfds_split(name, split, data_dir, manual_dir)
    return _to_split(name, split, images, labels, names, source)


def _to_split(name, split, images: np.ndarray, labels: np.ndarray, names: tuple[str, ...],
              source: str) -> Split:
    """Device arrays from class-major images and their labels."""
    num_classes = len(names)
    sizes = np.bincount(labels, minlength=num_classes).astype(np.int32)
    order = np.argsort(labels, kind="stable")
    table = np.full((num_classes, int(sizes.max())), -1, np.int32)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    for c in range(num_classes):
        table[c, :sizes[c]] = order[starts[c]:starts[c] + sizes[c]]
    chex.assert_rank(images, 4)
    chex.assert_type(images, np.uint8)
    chex.assert_shape(labels, (images.shape[0],))
    info = SplitInfo(name, split, num_classes, len(images), tuple(images.shape[1:]), names, source)
    return Split(jnp.asarray(images), jnp.asarray(table), jnp.asarray(sizes), info)


@functools.lru_cache(maxsize=2)  # the three splits of one set share one generation
def _generated(num_classes: int, samples_per_class: int, image_size: int, seed: int):
    from cfsl_jax.datasets import synthetic
    return synthetic.generate(num_classes, samples_per_class, image_size, seed)


def _synthetic(split: str, num_classes: int = 1623, samples_per_class: int = 20,
               image_size: int = 28, seed: int = 0):
    from cfsl_jax.datasets import omniglot, synthetic
    for option, value, low in (("num_classes", num_classes, 3),
                               ("samples_per_class", samples_per_class, 1),
                               ("image_size", image_size, 8)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"synthetic option {option} must be an integer >= {low}, "
                             f"got {value!r}")
    images, labels = _generated(num_classes, samples_per_class, image_size, seed)
    classes = omniglot.split_ranges(num_classes)[split]
    keep = (labels >= classes.start) & (labels < classes.stop)
    names = tuple(synthetic.class_name(c) for c in classes)
    return (images[keep], labels[keep] - classes.start, names,
            f"generated: num_classes={num_classes} samples_per_class={samples_per_class} "
            f"image_size={image_size} seed={seed}")


def _omniglot_config(name: str, data_dir: str, manual_dir: str | None) -> str:
    """The builder config of ``omniglot`` / ``omniglot/<config>`` (see the module docstring)."""
    from cfsl_jax.datasets.omniglot import CONFIGS, CfslOmniglot
    if "/" in name:
        return name.split("/", 1)[1]
    if manual_dir:
        for config in ("full", "small"):
            if all(os.path.isfile(os.path.join(manual_dir, z)) for z in CONFIGS[config].zip_names):
                return config
    for config in ("full", "small"):
        if _is_prepared(CfslOmniglot(config=config, data_dir=data_dir, file_format="array_record")):
            return config
    if manual_dir:
        from cfsl_jax.datasets.errors import DatasetNotFoundError
        raise DatasetNotFoundError(
            f"no Omniglot zips in {manual_dir} (expected {' and '.join(CONFIGS['full'].zip_names)} "
            f"for omniglot/full, or {' and '.join(CONFIGS['small'].zip_names)} for "
            f"omniglot/small) and no prepared omniglot in {data_dir}")
    return "full"  # prepared from TFDS's default manual dir, else downloaded


def _is_prepared(builder) -> bool:
    """TFDS's check, without its warning for a folder that does not exist yet."""
    return builder.data_path.exists() and builder.is_prepared()


def _builder(name: str, data_dir: str, manual_dir: str | None):
    if name.startswith("omniglot"):
        from cfsl_jax.datasets.omniglot import CfslOmniglot
        config = _omniglot_config(name, data_dir, manual_dir)
        builder = CfslOmniglot(config=config, data_dir=data_dir, file_format="array_record")
        return builder, f"omniglot/{config}"
    from cfsl_jax.datasets.slimagenet64 import CfslSlimagenet64
    return CfslSlimagenet64(data_dir=data_dir, file_format="array_record"), name


def _tfds_split(name: str, split: str, data_dir: str, manual_dir: str | None):
    import tensorflow_datasets as tfds
    builder, resolved = _builder(name, data_dir, manual_dir)
    if not _is_prepared(builder):
        config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
        builder.download_and_prepare(download_config=config)
    source = builder.as_data_source(split=split)
    count = len(source)
    images = np.empty((count, *builder.info.features["image"].shape), np.uint8)
    labels = np.empty(count, np.int64)
    drawings = np.empty(count, np.int64)
    names_by_label: dict[int, str] = {}
    for begin in range(0, count, _READ_CHUNK):  # chunks bound the list of decoded records
        records = source.__getitems__(list(range(begin, min(begin + _READ_CHUNK, count))))
        for offset, record in enumerate(records):
            images[begin + offset] = record["image"]
            labels[begin + offset] = record["label"]
            drawings[begin + offset] = record["drawing"]
            class_name = record["class_name"]
            names_by_label[int(record["label"])] = (
                class_name.decode() if isinstance(class_name, bytes) else str(class_name))
    order = np.lexsort((drawings, labels))  # by (label, drawing): deterministic class table
    if sorted(names_by_label) != list(range(len(names_by_label))):
        raise ValueError(f"{resolved}/{split} in {data_dir}: labels are not 0..C-1")
    names = tuple(names_by_label[c] for c in range(len(names_by_label)))
    return images[order], labels[order], names, f"{resolved} prepared in {data_dir}"
