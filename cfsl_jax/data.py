"""Splits as device arrays: images, a padded class table, class sizes.

    split = load_split("omniglot", "train", manual_dir="FOLDER_WITH_ZIPS")
    split.images        # uint8 [N, H, W, C] on device
    split.class_table   # int32 [C, S]: row c = indices into images of class c, padded with -1
    split.class_sizes   # int32 [C]
    x = gather_normalised(split, task.support_idx)   # float32 [..., H, W, C], in jit

Datasets (``DATASETS``; the names, options and their defaults: ``cfsl_jax.dataset_options``):
- ``synthetic``: procedurally generated glyph classes (``datasets/synthetic.py``),
  built in memory (no disk, 1-3 s on 2 cores); options ``num_classes`` (1623),
  ``samples_per_class`` (20), ``image_size`` (28), ``seed`` (0). Class split
  rule as Omniglot's (1623 -> 1200/211/212).
- ``omniglot`` (``omniglot/full``, ``omniglot/small``): the TFDS builder
  ``cfsl_omniglot`` prepared from the official zips in ``manual_dir``. Plain
  ``omniglot`` picks ``full`` if both full zips are in ``manual_dir``, else
  ``small`` if both small zips are, else a config already prepared in
  ``data_dir`` (full first), else asks for the full zips. Nothing is
  downloaded unless ``download=True``: without it, a dataset that is neither
  prepared nor in ``manual_dir`` (or TFDS's ``<data_dir>/downloads/manual``) is
  refused at once, naming the files and where to put them, and a failed
  preparation leaves no new folder behind. Option ``class_split``:
  ``"ordered"`` (default: the builder's alphabet-ordered 1200/211/212) or
  ``"authors"`` (full only: the authors' RandomState(100) shuffle,
  ``datasets/omniglot.py``; same 1200/211/212 sizes, different classes).
  Option ``resize``: ``"nearest"`` (default; builder config and variant
  ``full_nearest``) or ``"lanczos"`` (``full``).
- ``slimagenet64``: the TFDS builder ``cfsl_slimagenet64`` prepared from
  ``SlimageNet64.tar.bz2`` in ``manual_dir``; its own train/val/test split.
  Option ``normalisation``: ``"imagenet"`` (default; variant
  ``slimagenet64/imagenet_norm``) or ``"unit"`` (/255 only; ``slimagenet64``).
  The preprocessing options: ``datasets/preprocessing.py``.

TFDS datasets are written as ``array_record`` into ``data_dir`` (default
``$CFSL_DATA_DIR`` or ``~/tensorflow_datasets``) on first use and read back
with the TFDS data source API (no TensorFlow). Records are ordered by
(label, drawing), so the class table is the same on every machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
from typing import Any, Iterator, NamedTuple

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.dataset_options import (  # noqa: F401 (re-exported: read as data.X)
    DATASETS, OMNIGLOT_CLASS_SPLITS, SPLITS, SYNTHETIC_DEFAULTS, SYNTHETIC_OPTIONS, check_options,
    check_synthetic, default_data_dir, normalised_options, option_defaults)
from cfsl_jax.datasets.preprocessing import IMAGENET, Normalisation
from cfsl_jax.runtime import progress
from cfsl_jax.runtime.errors import UserError

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
    source: str  # where the images come from, for people (may name this machine's folders)
    variant: str = ""  # what the images are, for the task fingerprint (no machine's folder)
    normalisation: Normalisation | None = None  # after /255; None: values stay in [0, 1]

    @property
    def dataset_variant(self) -> str:
        """The dataset as results name it: the prepared variant (``omniglot/small`` for a
        plain ``omniglot``), or the dataset itself for one generated in memory
        (``synthetic``, whose ``variant`` is its description)."""
        return self.variant if self.variant and self.variant != self.source else self.dataset


class Source(NamedTuple):
    text: str  # SplitInfo.source
    variant: str  # SplitInfo.variant


@flax.struct.dataclass
class Split:
    """One class split of a dataset, on device."""

    images: jax.Array  # uint8 [N, H, W, C]
    class_table: jax.Array  # int32 [C, S] image indices of each class, padded with -1
    class_sizes: jax.Array  # int32 [C] valid entries of each row
    info: SplitInfo = flax.struct.field(pytree_node=False)


def gather_normalised(split_or_images: Split | jax.Array, indices: jax.Array) -> jax.Array:
    """Images at ``indices`` (any shape) as float32: /255, then the split's per-channel
    ``SplitInfo.normalisation`` if it has one (raw images: /255 only); works inside jit."""
    if isinstance(split_or_images, Split):
        images, norm = split_or_images.images, split_or_images.info.normalisation
    else:
        images, norm = split_or_images, None
    x = images[indices].astype(jnp.float32) / 255.0
    if norm is None:
        return x
    return (x - jnp.asarray(norm.mean, jnp.float32)) / jnp.asarray(norm.std, jnp.float32)


def load_split(name: str, split: str, data_dir: str | None = None,
               manual_dir: str | None = None, download: bool = False, **options: Any) -> Split:
    """Load (preparing on first use) one split of dataset ``name`` onto the device.

    Args:
      name: one of ``DATASETS``.
      split: one of ``SPLITS``.
      data_dir: where TFDS datasets are prepared and read (default ``$CFSL_DATA_DIR`` or
        ``~/tensorflow_datasets``); unused by ``synthetic``.
      manual_dir: the folder holding the raw archives (TFDS ``manual_dir``); needed only
        to prepare. Without it TFDS's ``<data_dir>/downloads/manual`` is used.
      download: Omniglot only: fetch the zips from GitHub when they are not in the
        manual folder (otherwise that is refused at once).
      **options: ``synthetic``: ``num_classes``, ``samples_per_class``,
        ``image_size``, ``seed``; ``omniglot``: ``class_split`` ("ordered", "authors"),
        ``resize`` ("nearest", "lanczos"); ``slimagenet64``: ``normalisation``
        ("imagenet", "unit"). A preprocessing option not given takes its default.

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
        unknown = sorted(set(options) - set(SYNTHETIC_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for dataset 'synthetic'; "
                             f"valid: {SYNTHETIC_OPTIONS}")
        images, labels, names, source = _synthetic(split, **options)
    else:
        chosen = check_options(name, options)
        data_dir = os.path.abspath(data_dir or default_data_dir())
        manual_dir = os.path.abspath(manual_dir) if manual_dir else None
        class_split = options.get("class_split", OMNIGLOT_CLASS_SPLITS[0])
        resize = chosen if name.startswith("omniglot") else None
        with _tfds_scope(data_dir):
            if class_split == "ordered":
                images, labels, names, source = _tfds_split(name, split, data_dir, manual_dir,
                                                            download, resize)
            else:
                images, labels, names, source = _authors_split(name, split, data_dir,
                                                               manual_dir, download, class_split,
                                                               resize)
        if chosen == "imagenet":
            return _to_split(name, split, images, labels, names, source._replace(
                text=source.text + ", ImageNet mean/std",
                variant=source.variant + "/imagenet_norm"), IMAGENET)
    return _to_split(name, split, images, labels, names, source)


@contextlib.contextmanager
def _tfds_scope(data_dir: str) -> Iterator[None]:
    """Inside: TFDS's temporary folders go into a folder of our own under ``data_dir`` (under
    ``$TMPDIR`` while ``data_dir`` does not exist yet), removed at the end, and its tqdm bars
    are off (our progress lines say what happens)."""
    import tempfile

    from tensorflow_datasets.core.utils import tqdm_utils
    folder = tempfile.mkdtemp(prefix=".cfsl-tmp-", dir=data_dir if os.path.isdir(data_dir)
                              else None)
    previous_tempdir = tempfile.tempdir
    previous_bars = tqdm_utils._active  # pylint: disable=protected-access
    tempfile.tempdir = folder
    tqdm_utils.display_progress_bar(False)
    try:
        yield
    finally:
        tempfile.tempdir = previous_tempdir
        tqdm_utils.display_progress_bar(previous_bars)
        shutil.rmtree(folder, ignore_errors=True)


def _to_split(name, split, images: np.ndarray, labels: np.ndarray, names: tuple[str, ...],
              source: Source, normalisation: Normalisation | None = None) -> Split:
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
    info = SplitInfo(name, split, num_classes, len(images), tuple(images.shape[1:]), names,
                     source.text, source.variant, normalisation)
    return Split(jnp.asarray(images), jnp.asarray(table), jnp.asarray(sizes), info)


@functools.lru_cache(maxsize=2)  # the three splits of one set share one generation
def _generated(num_classes: int, samples_per_class: int, image_size: int, seed: int):
    from cfsl_jax.datasets import synthetic
    return synthetic.generate(num_classes, samples_per_class, image_size, seed)


def _synthetic(split: str, num_classes: int = SYNTHETIC_DEFAULTS["num_classes"],
               samples_per_class: int = SYNTHETIC_DEFAULTS["samples_per_class"],
               image_size: int = SYNTHETIC_DEFAULTS["image_size"],
               seed: int = SYNTHETIC_DEFAULTS["seed"]):
    from cfsl_jax.datasets import omniglot, synthetic
    check_synthetic(dict(num_classes=num_classes, samples_per_class=samples_per_class,
                         image_size=image_size))
    images, labels = _generated(num_classes, samples_per_class, image_size, seed)
    classes = omniglot.split_ranges(num_classes)[split]
    keep = (labels >= classes.start) & (labels < classes.stop)
    names = tuple(synthetic.class_name(c) for c in classes)
    text = (f"generated: num_classes={num_classes} samples_per_class={samples_per_class} "
            f"image_size={image_size} seed={seed}")
    return images[keep], labels[keep] - classes.start, names, Source(text, text)


def _omniglot_config(name: str, data_dir: str, manual_dir: str | None, resize: str) -> str:
    """The builder config of ``omniglot`` / ``omniglot/<zips>`` resized by ``resize`` (see the
    module docstring)."""
    from cfsl_jax.datasets.omniglot import CONFIGS, CfslOmniglot, config_name
    if "/" in name:
        return config_name(name.split("/", 1)[1], resize)
    if manual_dir:
        for config in ("full", "small"):
            if all(os.path.isfile(os.path.join(manual_dir, z)) for z in CONFIGS[config].zip_names):
                return config_name(config, resize)
    for config in (config_name("full", resize), config_name("small", resize)):
        if _is_prepared(_open_builder(CfslOmniglot, config, data_dir)):
            return config
    if manual_dir:
        from cfsl_jax.datasets.errors import DatasetNotFoundError
        if not os.path.isdir(manual_dir):
            raise DatasetNotFoundError(f"--manual_dir={manual_dir} does not exist (and no "
                                       f"omniglot is prepared in {data_dir})")
        raise DatasetNotFoundError(
            f"--manual_dir={manual_dir} holds no Omniglot zips (expected "
            f"{' and '.join(CONFIGS['full'].zip_names)} for omniglot/full, or "
            f"{' and '.join(CONFIGS['small'].zip_names)} for omniglot/small) and no omniglot is "
            f"prepared in {data_dir}")
    return config_name("full", resize)  # prepared from TFDS's default manual dir, else downloaded


def _prepared_folder(builder_class, config: str | None, data_dir: str) -> str:
    """The folder TFDS prepares ``builder_class`` (config ``config``) in under ``data_dir``."""
    parts = [data_dir, builder_class.name] + ([config] if config else [])
    return os.path.join(*parts, str(builder_class.VERSION))


@contextlib.contextmanager
def _damaged_if_unreadable(folder: str, what: str) -> Iterator[None]:
    """Inside: a failure to read the prepared dataset in ``folder`` (a file deleted, truncated
    or edited: TFDS's, array_record's or protobuf's own errors) is a ``CorruptDatasetError``
    naming the folder and what to do, not a traceback."""
    from cfsl_jax.datasets.errors import CorruptDatasetError
    try:
        yield
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001  (RuntimeError, OSError, ParseError, ValueError...)
        reason = " ".join(str(error).split()) or type(error).__name__
        raise CorruptDatasetError(
            f"{what} prepared in {folder} cannot be read: {reason[:300]}; it was damaged "
            f"(a file deleted, cut short or edited): delete {folder} and run again (with "
            f"--manual_dir) to prepare it anew") from error


def _open_builder(builder_class, config: str | None, data_dir: str):
    """``builder_class`` on ``data_dir`` (which reads a prepared folder's dataset_info.json)."""
    kwargs = {"config": config} if config else {}
    name = f"{builder_class.name}/{config}" if config else builder_class.name
    with _damaged_if_unreadable(_prepared_folder(builder_class, config, data_dir), name):
        return builder_class(data_dir=data_dir, file_format="array_record", **kwargs)


def _is_prepared(builder) -> bool:
    """TFDS's check, without its warning for a folder that does not exist yet."""
    return builder.data_path.exists() and builder.is_prepared()


def _builder(name: str, data_dir: str, manual_dir: str | None, resize: str | None):
    if name.startswith("omniglot"):
        from cfsl_jax.datasets.omniglot import CfslOmniglot
        config = _omniglot_config(name, data_dir, manual_dir, resize)
        return _open_builder(CfslOmniglot, config, data_dir), f"omniglot/{config}"
    from cfsl_jax.datasets.slimagenet64 import CfslSlimagenet64
    return _open_builder(CfslSlimagenet64, None, data_dir), name


def _prepare(builder, resolved: str, data_dir: str, manual_dir: str | None,
             download: bool) -> None:
    """Prepare ``builder`` from the archives; a failure removes every folder the attempt
    created. Without ``manual_dir``, an Omniglot whose zips are not in TFDS's default manual
    folder is refused at once unless ``download`` (an explicit ``manual_dir`` is never
    downloaded behind: the builder names the missing zips)."""
    import tensorflow_datasets as tfds
    folder = manual_dir or os.path.join(data_dir, "downloads", "manual")
    if resolved.startswith("omniglot") and (manual_dir or not download):
        from cfsl_jax.datasets.errors import DatasetNotFoundError
        from cfsl_jax.datasets.omniglot import CONFIGS
        zips = CONFIGS[resolved.split("/")[1]].zip_names
        missing = [z for z in zips if not os.path.isfile(os.path.join(folder, z))]
        if missing and manual_dir:  # before the "preparing" line
            raise DatasetNotFoundError(
                f"--manual_dir={manual_dir}: {', '.join(missing)} not found there ({resolved} "
                f"is prepared from {' and '.join(zips)}, from https://github.com/brendenlake/"
                f"omniglot/tree/master/python)")
        if missing:
            raise DatasetNotFoundError(
                f"{resolved} is not prepared in {data_dir} and {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not in {folder}: put "
                f"{' and '.join(zips)} (from https://github.com/brendenlake/omniglot/tree/"
                f"master/python) in a folder and pass it as --manual_dir, or pass --download "
                f"to fetch them")
    created = _missing_ancestors(builder.data_path) + _missing_ancestors(
        os.path.join(data_dir, "downloads", "manual"))
    config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
    # TFDS prints "Downloading and preparing dataset ..." even when nothing downloads.
    builder._log_download_bytes = lambda: None  # pylint: disable=protected-access
    builder._log_download_done = lambda: None  # pylint: disable=protected-access
    try:
        with progress.stage(f"[data] preparing {resolved} in {data_dir} (once)"):
            builder.download_and_prepare(download_config=config)
    except BaseException:
        for path in sorted(set(created), key=len, reverse=True):  # deepest first
            shutil.rmtree(path, ignore_errors=True)
        raise


def _missing_ancestors(path) -> list[str]:
    """``path`` and its ancestors that do not exist yet (what preparing it would create)."""
    path, missing = os.path.abspath(os.fspath(path)), []
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _tfds_split(name: str, split: str, data_dir: str, manual_dir: str | None,
                download: bool = False, resize: str | None = None):
    builder, resolved = _builder(name, data_dir, manual_dir, resize)
    if not _is_prepared(builder):
        _prepare(builder, resolved, data_dir, manual_dir, download)
    with _damaged_if_unreadable(os.fspath(builder.data_path), resolved):
        images, labels, names = _read_prepared(builder, split, resolved, data_dir)
    return images, labels, names, Source(f"{resolved} prepared in {data_dir}", resolved)


def _check_record_counts(builder, split: str, count: int) -> None:
    """ValueError unless ``split``'s array_record files hold ``count`` records, the number its
    dataset_info.json records: a file replaced by another split's (or another preparation's)
    would otherwise be read, its first ``count`` records, as this split."""
    from array_record.python.array_record_module import ArrayRecordReader
    pattern = f"{builder.name}-{split}.array_record-"
    paths = sorted(os.path.join(builder.data_path, name) for name in os.listdir(builder.data_path)
                   if name.startswith(pattern))
    held = 0
    for path in paths:
        reader = ArrayRecordReader(path)
        try:
            held += reader.num_records()
        finally:
            reader.close()
    if held != count:
        raise ValueError(f"its {split} files hold {held} records, its dataset_info.json "
                         f"records {count}")


def _read_prepared(builder, split: str, resolved: str, data_dir: str):
    """A prepared split's images, labels and class names, class-major by (label, drawing)."""
    source = builder.as_data_source(split=split)
    count = len(source)
    _check_record_counts(builder, split, count)
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
        raise ValueError(f"its {split} split's labels are not 0..C-1")
    names = tuple(names_by_label[c] for c in range(len(names_by_label)))
    return images[order], labels[order], names


@functools.lru_cache(maxsize=1)  # the three splits of one run share one read
def _all_omniglot_classes(name: str, data_dir: str, manual_dir: str | None, download: bool,
                          resize: str):
    """Every class of a prepared Omniglot config: (images, global labels, names, source)."""
    parts = [_tfds_split(name, split, data_dir, manual_dir, download, resize) for split in SPLITS]
    images = np.concatenate([p[0] for p in parts])
    offsets = np.cumsum([0] + [len(p[2]) for p in parts[:-1]])
    labels = np.concatenate([p[1] + offset for p, offset in zip(parts, offsets)])
    names = tuple(n for p in parts for n in p[2])
    return images, labels, names, parts[0][3]


def _authors_split(name: str, split: str, data_dir: str, manual_dir: str | None,
                   download: bool, class_split: str, resize: str):
    """One split of Omniglot under the authors' class split (``datasets/omniglot.py``)."""
    if class_split not in OMNIGLOT_CLASS_SPLITS:
        raise UserError(f"class_split={class_split!r} for dataset {name!r}; valid: "
                        f"{OMNIGLOT_CLASS_SPLITS}")
    if name.endswith("/small"):
        raise UserError("class_split='authors' is the authors' split of the 1623 characters "
                        "of omniglot/full; omniglot/small has 242")
    from cfsl_jax.datasets.omniglot import authors_split
    images, labels, names, source = _all_omniglot_classes(
        "omniglot/full", data_dir, manual_dir, download, resize)
    chosen = authors_split(names)[split]
    images, labels = select_classes(images, labels, names, chosen)
    return images, labels, tuple(chosen), source._replace(
        text=source.text + ", the authors' class split (RandomState(100))")


def select_classes(images: np.ndarray, labels: np.ndarray, names: tuple[str, ...],
                   chosen: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The images of the classes ``chosen`` (names), relabelled 0.. in ``chosen``'s order,
    class-major with each class's images in their original order."""
    index = {class_name: c for c, class_name in enumerate(names)}
    new_label = np.full(len(names), -1, np.int64)
    new_label[[index[n] for n in chosen]] = np.arange(len(chosen))
    keep = new_label[labels] >= 0
    kept_labels = new_label[labels[keep]]
    order = np.argsort(kept_labels, kind="stable")
    return images[keep][order], kept_labels[order]
