"""SlimageNet64 as a TFDS builder (`cfsl_slimagenet64`), prepared from the zenodo archive.

Source: `SlimageNet64.tar.bz2` (https://zenodo.org/record/3672132) in TFDS's
`manual_dir`. The archive holds `SlimageNet64/{train,val,test}/<class>/<image>`.
Its own train/val/test split is kept exactly.

Rules:
- A member is an image of split `s` and class `c` when its path ends in
  `<s>/<c>/<file>` with `s` in train/val/test (a leading `./` or `SlimageNet64/`
  is allowed). Hidden files (`.*`, macOS `._*`) are ignored; any other file PIL
  opens is an image; a file PIL cannot open is an error only if its extension
  says it is an image (.png/.jpg/.jpeg/.bmp/.gif/.webp), otherwise it is ignored.
- Images are converted to RGB and resized to 64x64 (LANCZOS) if not already.
- `label` is the class index within its split, classes in sorted name order;
  `drawing` is the image's index within its class in sorted file-name order;
  `class_name` is the class folder name.

The archive is streamed (`tarfile.open(path, "r|bz2")`, memory-bounded; the
real archive is several GB): one pass indexes and checks every member (names,
image headers) before anything is written, then one pass per split decodes and
yields that split's images. So preparation reads the archive four times but
holds at most one image (plus TFDS's own bounded shuffle buffer) in memory.

Errors: a missing archive raises `DatasetNotFoundError` naming the file and
the folder; an unreadable archive (`tarfile.ReadError`, truncated stream,
bad bz2 data), an undecodable image, an empty split or an empty class raises
`CorruptDatasetError` naming the file and the reason. TFDS writes into an
`incomplete.*` folder renamed only on success, so a failure never looks prepared.
"""

from __future__ import annotations

import collections
import io
import os
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from .errors import CorruptDatasetError, DatasetNotFoundError
from .omniglot import SPLITS, example_features

ARCHIVE_NAME = "SlimageNet64.tar.bz2"
IMAGE_SIZE = 64
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
READ_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)  # bz2 errors are OSError

Member = tuple[str, str, str]  # (split, class name, file name)


def _member_key(name: str) -> Member | None:
    """(split, class, file) for `.../<split>/<class>/<file>`, else None."""
    parts = [part for part in PurePosixPath(name).parts if part not in (".", "/")]
    if len(parts) < 3 or parts[-3] not in SPLITS or parts[-1].startswith("."):
        return None
    if len(parts) > 4 or (len(parts) == 4 and parts[0] != "SlimageNet64"):
        return None
    return parts[-3], parts[-2], parts[-1]


def _class_dir_key(name: str) -> tuple[str, str] | None:
    """(split, class) for a directory member `.../<split>/<class>`, else None."""
    parts = [part for part in PurePosixPath(name).parts if part not in (".", "/")]
    if len(parts) >= 2 and parts[-2] in SPLITS and len(parts) <= 3:
        return parts[-2], parts[-1]
    return None


def _stream(path: Path) -> Iterator[tuple[tarfile.TarInfo, tarfile.TarFile]]:
    try:
        with tarfile.open(path, "r|bz2") as archive:
            for member in archive:
                yield member, archive
    except READ_ERRORS as error:
        raise CorruptDatasetError(f"{path}: cannot read the archive ({type(error).__name__}: {error})") from error


def _read(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> bytes:
    try:
        handle = archive.extractfile(member)
        return handle.read() if handle is not None else b""
    except READ_ERRORS as error:
        raise CorruptDatasetError(f"{path}: cannot read member {member.name} ({error})") from error


def index_archive(path: Path) -> dict[str, dict[str, list[str]]]:
    """split -> class -> sorted image file names; checks every image header and non-emptiness."""
    images: dict[str, dict[str, list[str]]] = {split: collections.defaultdict(list) for split in SPLITS}
    class_dirs: set[tuple[str, str]] = set()
    for member, archive in _stream(path):
        if member.isdir():
            key = _class_dir_key(member.name)
            if key is not None:
                class_dirs.add(key)
            continue
        key = _member_key(member.name) if member.isfile() else None
        if key is None:
            continue
        split, class_name, file_name = key
        class_dirs.add((split, class_name))
        data = _read(archive, member, path)
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
        except Exception as error:  # PIL raises many types for bad data
            if file_name.lower().endswith(IMAGE_EXTENSIONS):
                raise CorruptDatasetError(f"{path}: undecodable image {member.name} ({error})") from error
            continue  # not an image: ignored
        images[split][class_name].append(file_name)
    for split in SPLITS:
        if not images[split]:
            raise CorruptDatasetError(f"{path}: split {split!r} has no classes (expected SlimageNet64/{split}/<class>/<image>)")
    for split, class_name in sorted(class_dirs):
        if not images[split].get(class_name):
            raise CorruptDatasetError(f"{path}: class {split}/{class_name} has no images")
    return {split: {name: sorted(files) for name, files in sorted(classes.items())}
            for split, classes in images.items()}


def decode_image(data: bytes, source: str) -> np.ndarray:
    """Image bytes -> uint8 RGB [64, 64, 3] (LANCZOS-resized if needed)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except Exception as error:
        raise CorruptDatasetError(f"{source}: undecodable image ({error})") from error
    if rgb.size != (IMAGE_SIZE, IMAGE_SIZE):
        rgb = rgb.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.LANCZOS)
    return np.asarray(rgb, dtype=np.uint8)


class CfslSlimagenet64(tfds.core.GeneratorBasedBuilder):
    """SlimageNet64, 64x64 RGB, the archive's own train/val/test classes."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        f"Download {ARCHIVE_NAME} from https://zenodo.org/record/3672132 and place it in manual_dir."
    )

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=example_features((IMAGE_SIZE, IMAGE_SIZE, 3)),
            supervised_keys=("image", "label"),
            homepage="https://zenodo.org/record/3672132",
            citation="Antoniou, Patacchiola, Ochal, Storkey. Defining benchmarks for continual "
                     "few-shot learning. arXiv:2004.11967, 2020.",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        # The public `manual_dir` property raises a bare AssertionError on an empty folder.
        folder = Path(os.fspath(dl_manager._manual_dir))  # pylint: disable=protected-access
        path = folder / ARCHIVE_NAME
        if not path.is_file():
            raise DatasetNotFoundError(
                f"{ARCHIVE_NAME} not found in {folder}. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
        index = index_archive(path)
        return {split: self._generate_examples(path, split, index[split]) for split in SPLITS}

    def _generate_examples(self, path: Path, split: str, classes: dict[str, list[str]]) -> Iterator:
        position = {(name, file_name): (label, drawing)
                    for label, (name, files) in enumerate(classes.items())
                    for drawing, file_name in enumerate(files)}
        remaining = len(position)
        for member, archive in _stream(path):
            key = _member_key(member.name) if member.isfile() else None
            if key is None or key[0] != split or key[1:] not in position:
                continue
            label, drawing = position[key[1:]]
            image = decode_image(_read(archive, member, path), f"{path}:{member.name}")
            yield f"{key[1]}/{key[2]}", {
                "image": image, "label": label, "drawing": drawing, "class_name": key[1]}
            remaining -= 1
            if remaining == 0:
                break  # the rest of the archive holds nothing for this split
