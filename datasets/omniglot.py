"""Omniglot as a TFDS builder (`cfsl_omniglot`), prepared from the official zips.

Source: the zips of https://github.com/brendenlake/omniglot (MIT licence),
read from TFDS's `manual_dir` (`DownloadConfig(manual_dir=...)`). Two configs:

- `full`: `images_background.zip` (964 characters) + `images_evaluation.zip`
  (659 characters) = 1623 characters.
- `small`: `images_background_small1.zip` (136 characters) +
  `images_background_small2.zip` (156 characters). They overlap (50 characters
  in common), so they are de-duplicated by (alphabet, character) name, the first
  occurrence winning: 242 distinct characters.

Every character has 20 drawings. A zip member `<root>/<Alphabet>/<characterNN>/<file>.png`
is drawing number `i` of class `Alphabet/characterNN`, where `i` is the rank of
`<file>` among that character's file names (sorted).

The 105x105 PNGs are 1 bit per pixel (mode "1") and are resized to 28x28 in one
of two ways (`RESIZES`), each its own builder config (`<config>` and
`<config>_nearest`), so a prepared dataset names how its images were made:

- `nearest` (configs `full_nearest`, `small_nearest`): PIL's NEAREST resize of
  the 1-bit image, then greyscale, so every pixel is 0 or 255. This is what the
  authors' `transforms.Resize((28, 28))` does to these PNGs (Pillow resizes a
  mode "1" image with NEAREST whatever filter is asked).
- `lanczos` (configs `full`, `small`): greyscale ("L") first, then PIL's
  LANCZOS filter (antialiased): grey levels at the strokes' edges.

Either way ink stays dark on a light background, as in the source:
255 = paper, 0 = ink.

Class split rule (deterministic, shared with the synthetic set): order the
distinct characters by (source zip order background -> evaluation (or small1 ->
small2), alphabet name, character name). With `C` characters, the first
`round(C * 1200 / 1623)` are `train`; of the rest, the first half (rounded
down) is `val` and the remainder `test`. full: 1200/211/212; small: 179/31/32.
`label` is the class index within its split, in that order.

The authors' split (`class_split="authors"` of `cfsl_jax.data.load_split`, full
config only; `authors_split` here): their code (docs/fidelity.md gives the
source) names a class by
the folders `[-3, -2]` of an image's path ("Alphabet/characterNN"), sorts the
1623 names (Python's string order), numbers them 0..1622 in that order,
shuffles the numbers with `numpy.random.RandomState(100).shuffle` (seed: the
`--seed` default 100 of `utils/parser_utils.py`; the configs set no `seed`),
and takes the first `int(0.73982737361 * 1623)` = 1200 shuffled classes for
train, the next up to `int((0.73982737361 + 0.13008631319) * 1623)` = 1411
for val (211) and the rest for test (212)
(`experiment_template_config/omniglot_variant.json`). `RandomState` is
numpy's frozen legacy generator, so the shuffle is the same in every numpy
version. One assumption: their `omniglot_dataset` archive (a Google Drive
tarball, not public here) uses the official zips' alphabet and character folder
names; its file count check (1623 x 20 images) supports it.

Features per example: `image` uint8 [28, 28, 1], `label` int32, `drawing`
int32 (0..19), `class_name` text ("Alphabet/characterNN").

Errors: a missing zip raises `DatasetNotFoundError` naming the expected files
and the folder searched; an unreadable zip (bad archive, failed CRC, an
undecodable PNG) or an incomplete one (a character with other than 20
drawings, an unexpected number of characters) raises `CorruptDatasetError`
naming the file and the reason. Everything is read and checked before TFDS
writes a record, and TFDS writes into an `incomplete.*` folder that is only
renamed on success, so a failed preparation never looks prepared.

If no `manual_dir` is given, TFDS's default `<data_dir>/downloads/manual` is
used; if the zips are not there, `cfsl_jax.data.load_split` refuses at once
(naming the files and where to put them) unless asked to download
(`download=True`, `--download`): then this builder fetches them from GitHub.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import zipfile
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from .errors import CorruptDatasetError, DatasetNotFoundError
from .preprocessing import PREPROCESSING

IMAGE_SIZE = 28
DRAWINGS_PER_CHARACTER = 20
SPLITS = ("train", "val", "test")
DOWNLOAD_URL = "https://github.com/brendenlake/omniglot/raw/master/python/{}"

Character = tuple[str, list[tuple[str, bytes]]]  # (class name, [(file name, png bytes)])


RESIZES = PREPROCESSING["omniglot"].values  # how the 105x105 drawings become 28x28 (module doc)
_RESAMPLING = {"nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}


@dataclasses.dataclass(eq=False)
class OmniglotConfig(tfds.core.BuilderConfig):
    """Which zips make up the config, how many characters each must hold, how images resize."""

    zip_names: tuple[str, ...] = ()
    characters_per_zip: tuple[int, ...] = ()
    distinct_characters: int = 0
    resize: str = "lanczos"  # RESIZES


def config_name(base: str, resize: str) -> str:
    """The builder config of the zips ``base`` ("full", "small") resized by ``resize``."""
    return base if resize == "lanczos" else f"{base}_{resize}"


_ZIPS = {
    "full": dict(description="images_background + images_evaluation: 1623 characters.",
                 zip_names=("images_background.zip", "images_evaluation.zip"),
                 characters_per_zip=(964, 659), distinct_characters=1623),
    "small": dict(description="images_background_small1 + small2, de-duplicated: 242 characters.",
                  zip_names=("images_background_small1.zip", "images_background_small2.zip"),
                  characters_per_zip=(136, 156), distinct_characters=242),
}
CONFIGS: dict[str, OmniglotConfig] = {
    config_name(base, resize): OmniglotConfig(
        name=config_name(base, resize), resize=resize,
        **{**zips, "description": zips["description"] + (
            "" if resize == "lanczos" else f" {resize.capitalize()} resize of the 1-bit PNGs.")})
    for base, zips in _ZIPS.items() for resize in RESIZES
}


AUTHORS_SEED = 100  # utils/parser_utils.py --seed default (5b814ac)
AUTHORS_FRACTIONS = (0.73982737361, 0.13008631319, 0.13008631319)  # omniglot_variant.json
CLASS_SPLITS = ("ordered", "authors")


def authors_split(class_names: Sequence[str]) -> dict[str, list[str]]:
    """The authors' class split of the 1623 full-Omniglot names (module doc), in their order."""
    labels = sorted(set(class_names))
    if len(labels) != len(class_names) or len(labels) != CONFIGS["full"].distinct_characters:
        raise ValueError(f"the authors' split is defined on the "
                         f"{CONFIGS['full'].distinct_characters} distinct characters of "
                         f"omniglot/full, got {len(class_names)} names ({len(labels)} distinct)")
    order = np.arange(len(labels), dtype=np.int32)
    np.random.RandomState(seed=AUTHORS_SEED).shuffle(order)
    shuffled = [labels[i] for i in order]
    end_train = int(AUTHORS_FRACTIONS[0] * len(labels))
    end_val = int(np.sum(AUTHORS_FRACTIONS[:2]) * len(labels))
    return {"train": shuffled[:end_train], "val": shuffled[end_train:end_val],
            "test": shuffled[end_val:]}


def split_class_counts(num_classes: int) -> dict[str, int]:
    """Classes per split: round(C*1200/1623) train, then half (floor) val, rest test."""
    if num_classes < 3:
        raise ValueError(f"num_classes={num_classes}: need at least 3 classes to split")
    # Integer round-half-up of C*1200/1623 (no ties occur: 1623 = 3*541).
    num_train = (2 * num_classes * 1200 + 1623) // (2 * 1623)
    num_train = min(max(num_train, 1), num_classes - 2)
    num_val = (num_classes - num_train) // 2
    return {"train": num_train, "val": num_val, "test": num_classes - num_train - num_val}


def split_ranges(num_classes: int) -> dict[str, range]:
    """Class index ranges of each split in the ordered class list."""
    counts = split_class_counts(num_classes)
    start, ranges = 0, {}
    for split in SPLITS:
        ranges[split] = range(start, start + counts[split])
        start += counts[split]
    return ranges


def example_features(image_shape: Sequence[int]) -> tfds.features.FeaturesDict:
    """The features shared by all cfsl builders (no TensorFlow needed to encode)."""
    return tfds.features.FeaturesDict({
        "image": tfds.features.Tensor(shape=tuple(image_shape), dtype=np.uint8, encoding="zlib"),
        "label": np.int32,
        "drawing": np.int32,
        "class_name": tfds.features.Text(),
    })


def missing_files(folder: Path, names: Sequence[str]) -> list[str]:
    return [name for name in names if not (folder / name).is_file()]


def not_found_message(folder: Path, names: Sequence[str], missing: Sequence[str]) -> str:
    return (
        f"Omniglot zip(s) {', '.join(missing)} not found in {folder} "
        f"(expected files: {', '.join(names)}). Download them from "
        f"https://github.com/brendenlake/omniglot/tree/master/python and pass that folder "
        f"as manual_dir."
    )


def read_characters(path: Path, expected_characters: int) -> list[Character]:
    """Reads one zip: characters sorted by (alphabet, character), each with 20 drawings."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise CorruptDatasetError(f"{path}: not a readable zip archive ({error})") from error
    with archive:
        try:
            bad_member = archive.testzip()
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as error:
            raise CorruptDatasetError(f"{path}: cannot read the archive ({error})") from error
        if bad_member is not None:
            raise CorruptDatasetError(f"{path}: member {bad_member} fails its CRC check")
        drawings: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        for member in archive.namelist():
            parts = member.split("/")
            if (member.endswith("/") or "__MACOSX" in parts or parts[-1].startswith(".")
                    or not parts[-1].lower().endswith(".png")):
                continue
            if len(parts) < 3:
                raise CorruptDatasetError(
                    f"{path}: member {member} is not <alphabet>/<character>/<drawing>.png")
            drawings[(parts[-3], parts[-2])].append(member)
        for (alphabet, character), members in sorted(drawings.items()):
            if len(members) != DRAWINGS_PER_CHARACTER:
                raise CorruptDatasetError(
                    f"{path}: character {alphabet}/{character} has {len(members)} drawings, "
                    f"expected {DRAWINGS_PER_CHARACTER} (incomplete zip)")
        if len(drawings) != expected_characters:
            raise CorruptDatasetError(
                f"{path}: holds {len(drawings)} characters, expected {expected_characters} "
                "(incomplete or wrong zip)")
        return [
            (f"{alphabet}/{character}",
             [(member.split("/")[-1], archive.read(member))
              for member in sorted(members, key=lambda m: m.split("/")[-1])])
            for (alphabet, character), members in sorted(drawings.items())
        ]


def decode_drawing(png: bytes, source: str, resize: str = "lanczos") -> np.ndarray:
    """PNG bytes -> uint8 [28, 28, 1], greyscale, ink dark, resized by ``resize`` (module doc:
    ``nearest`` resizes the image in its own mode, ``lanczos`` its greyscale)."""
    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            if resize == "lanczos":
                image = image.convert("L")
            if image.size != (IMAGE_SIZE, IMAGE_SIZE):
                image = image.resize((IMAGE_SIZE, IMAGE_SIZE), _RESAMPLING[resize])
            grey = image.convert("L")
    except (OSError, ValueError, SyntaxError) as error:  # PIL.UnidentifiedImageError is an OSError
        raise CorruptDatasetError(f"{source}: undecodable PNG ({error})") from error
    return np.asarray(grey, dtype=np.uint8)[:, :, None]


def load_classes(paths: Sequence[Path], config: OmniglotConfig) -> list[tuple[str, np.ndarray]]:
    """All distinct characters of the config, in split-rule order, with decoded drawings."""
    seen: set[str] = set()
    ordered: list[tuple[Path, str, list[tuple[str, bytes]]]] = []  # (zip, class, files)
    for path, expected in zip(paths, config.characters_per_zip):
        for class_name, files in read_characters(path, expected):
            if class_name not in seen:  # first occurrence wins
                seen.add(class_name)
                ordered.append((path, class_name, files))
    if config.distinct_characters and len(ordered) != config.distinct_characters:
        raise CorruptDatasetError(
            f"{', '.join(str(p) for p in paths)}: {len(ordered)} distinct characters, expected "
            f"{config.distinct_characters} for config {config.name!r}")
    return [
        (class_name, np.stack([decode_drawing(png, f"{path}: {class_name}/{file_name}",
                                              config.resize)
                               for file_name, png in files]))
        for path, class_name, files in ordered
    ]


class CfslOmniglot(tfds.core.GeneratorBasedBuilder):
    """Omniglot, 28x28 grey (nearest or LANCZOS), 20 drawings per character, deterministic
    class split."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = list(CONFIGS.values())
    DEFAULT_CONFIG_NAME = "full"
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place the Omniglot zips from https://github.com/brendenlake/omniglot/tree/master/python "
        "in manual_dir: images_background.zip and images_evaluation.zip (config `full`) or "
        "images_background_small1.zip and images_background_small2.zip (config `small`)."
    )

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=example_features((IMAGE_SIZE, IMAGE_SIZE, 1)),
            supervised_keys=("image", "label"),
            homepage="https://github.com/brendenlake/omniglot",
            citation="Lake, Salakhutdinov, Tenenbaum. Human-level concept learning "
                     "through probabilistic program induction. Science, 2015.",
        )

    def _zip_paths(self, dl_manager: tfds.download.DownloadManager) -> list[Path]:
        config: OmniglotConfig = self.builder_config
        # The public `manual_dir` property raises a bare AssertionError on an empty folder;
        # we want a message naming the files.
        folder = Path(os.fspath(dl_manager._manual_dir))  # pylint: disable=protected-access
        missing = missing_files(folder, config.zip_names)
        if not missing:
            return [folder / name for name in config.zip_names]
        default_folder = Path(os.fspath(self.data_dir_root)) / "downloads" / "manual"
        if folder != default_folder:  # an explicit manual_dir: never download behind it
            raise DatasetNotFoundError(not_found_message(folder, config.zip_names, missing))
        try:
            downloaded = dl_manager.download(
                {name: DOWNLOAD_URL.format(name) for name in config.zip_names})
        except Exception as error:  # network off, proxy, HTTP error...
            raise DatasetNotFoundError(
                not_found_message(folder, config.zip_names, missing)
                + f" Downloading them failed: {error}") from error
        return [Path(os.fspath(downloaded[name])) for name in config.zip_names]

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        classes = load_classes(self._zip_paths(dl_manager), self.builder_config)
        ranges = split_ranges(len(classes))
        return {split: self._generate_examples([classes[i] for i in ranges[split]])
                for split in SPLITS}

    def _generate_examples(self, classes: list[tuple[str, np.ndarray]]) -> Iterator:
        for label, (class_name, images) in enumerate(classes):
            for drawing, image in enumerate(images):
                yield f"{class_name}/{drawing:02d}", {
                    "image": image, "label": label, "drawing": drawing, "class_name": class_name}
