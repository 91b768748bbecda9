"""Dataset builders and device splits on real mini-Omniglot, a generated SlimageNet64 archive and
the synthetic set; missing and corrupt inputs."""

import glob
import io
import os
import shutil
import tarfile
import tempfile
import time
import zipfile

import jax
import numpy as np
import pytest
from PIL import Image

from cfsl_jax import data
from cfsl_jax.datasets import synthetic
from cfsl_jax.datasets.errors import CorruptDatasetError, DatasetNotFoundError
from cfsl_jax.datasets.omniglot import split_class_counts


def test_omniglot_small_has_242_characters_of_20_drawings(omniglot_splits):
    sizes = {name: split.class_table.shape[0] for name, split in omniglot_splits.items()}
    assert sizes == {"train": 179, "val": 31, "test": 32}
    names = [n for split in omniglot_splits.values() for n in split.info.class_names]
    assert len(names) == len(set(names)) == 242
    for split in omniglot_splits.values():
        assert split.images.shape[1:] == (28, 28, 1) and split.images.dtype == np.uint8
        assert split.images.shape[0] == 20 * split.class_table.shape[0]
        assert (np.asarray(split.class_sizes) == 20).all()
        assert split.info.source.startswith("omniglot/small")
        # Ink dark on light paper: mostly light pixels.
        assert float(np.asarray(split.images).mean()) > 128
    # Class table rows are disjoint and cover every image once.
    table = np.asarray(omniglot_splits["train"].class_table)
    assert sorted(table.ravel().tolist()) == list(range(179 * 20))
    # The split rule keeps whole alphabets in order: train starts with the first alphabet.
    assert omniglot_splits["train"].info.class_names[0] == "Balinese/character01"


def test_omniglot_prepares_once_and_picks_the_small_config(omniglot_dir, data_dir,
                                                           omniglot_train):
    prepared = os.path.join(data_dir, "cfsl_omniglot", "small_nearest", "1.0.0")
    assert os.path.isdir(prepared)
    before = os.path.getmtime(os.path.join(prepared, "dataset_info.json"))
    again = data.load_split("omniglot/small", "train", data_dir=data_dir)  # no manual_dir needed
    assert os.path.getmtime(os.path.join(prepared, "dataset_info.json")) == before
    np.testing.assert_array_equal(again.images, omniglot_train.images)


def test_split_rule_counts():
    assert split_class_counts(1623) == {"train": 1200, "val": 211, "test": 212}
    assert split_class_counts(242) == {"train": 179, "val": 31, "test": 32}


def _png(array):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def make_slimagenet_archive(folder, classes={"train": 3, "val": 2, "test": 2}, images=4):
    rng = np.random.default_rng(0)
    pixels = {}
    path = os.path.join(folder, "SlimageNet64.tar.bz2")
    with tarfile.open(path, "w:bz2") as archive:
        for split, count in classes.items():
            for c in range(count):
                for i in range(images):
                    array = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
                    name = f"SlimageNet64/{split}/n{split}{c:03d}/img{i:02d}.png"
                    pixels[name] = array
                    payload = _png(array)
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    archive.addfile(info, io.BytesIO(payload))
    return path, pixels


def test_slimagenet64_keeps_its_split(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    _, pixels = make_slimagenet_archive(str(manual))
    for split, count in {"train": 3, "val": 2, "test": 2}.items():
        loaded = data.load_split("slimagenet64", split, data_dir=str(tmp_path / "tfds"),
                                 manual_dir=str(manual))
        assert loaded.info.class_names == tuple(f"n{split}{c:03d}" for c in range(count))
        assert loaded.images.shape == (count * 4, 64, 64, 3)
        table = np.asarray(loaded.class_table)
        for c in range(count):
            for i in range(4):
                source = pixels[f"SlimageNet64/{split}/n{split}{c:03d}/img{i:02d}.png"]
                np.testing.assert_array_equal(np.asarray(loaded.images)[table[c, i]], source)


def test_synthetic_is_deterministic_and_class_structured():
    start = time.perf_counter()
    images, labels = synthetic.generate()
    print(f"synthetic 1623x20 at 28x28 generated in {time.perf_counter() - start:.2f}s")
    assert images.shape == (1623 * 20, 28, 28, 1) and images.dtype == np.uint8
    assert float(images.mean()) > 128  # ink dark on light paper
    small, small_labels = synthetic.generate(num_classes=40, samples_per_class=20)
    assert synthetic.generate(num_classes=40, samples_per_class=20)[0].tobytes() == small.tobytes()
    np.testing.assert_array_equal(small_labels, np.repeat(np.arange(40), 20))
    other, _ = synthetic.generate(num_classes=40, samples_per_class=20, seed=1)
    assert not np.array_equal(other, small)
    assert synthetic.generate(num_classes=5, samples_per_class=3, image_size=32)[0].shape == (
        15, 32, 32, 1)
    # load_split applies the Omniglot class split rule to exactly these images.
    splits = {s: data.load_split("synthetic", s) for s in data.SPLITS}
    assert {s: v.class_table.shape[0] for s, v in splits.items()} == {
        "train": 1200, "val": 211, "test": 212}
    np.testing.assert_array_equal(splits["val"].images, images[1200 * 20:1411 * 20])
    assert splits["test"].info.class_names[0] == synthetic.class_name(1411)
    assert splits["train"].info.source.startswith("generated: num_classes=1623")
    # Samples of a class are closer to each other than to samples of other classes.
    x = small.reshape(40, 20, -1).astype(np.float32) / 255
    within = np.mean([np.linalg.norm(x[c, :, None] - x[c, None], axis=-1).mean()
                      for c in range(40)])
    between = np.mean([np.linalg.norm(x[c, :, None] - x[(c + 1) % 40, None], axis=-1).mean()
                       for c in range(40)])
    assert within < 0.8 * between



def test_synthetic_generation_shows_progress_only_when_it_takes_long(monkeypatch, capsys):
    capsys.readouterr()
    quick, _ = synthetic.generate(num_classes=40, samples_per_class=200)  # 8,000 images
    assert "generating synthetic glyphs" not in capsys.readouterr().out
    monkeypatch.setattr(synthetic.progress, "INTERVAL_S", 0.0)  # as if every chunk were slow
    slow, _ = synthetic.generate(num_classes=40, samples_per_class=200)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" images")[0] for line in lines] == [
        f"[generating synthetic glyphs] {n}/8000"
        for n in [*range(synthetic.CHUNK, 8000, synthetic.CHUNK), 8000]]
    # no ETA from the first chunk alone (its time may include compiling): from the second on
    assert "ETA" not in lines[0] and "ETA" in lines[1] and "done in" in lines[-1]
    assert slow.tobytes() == quick.tobytes()

def test_gather_normalised_in_jit(omniglot_train):
    indices = np.array([[0, 5, 7], [100, 3, 2]])
    gathered = jax.jit(data.gather_normalised)(omniglot_train, indices)
    expected = np.asarray(omniglot_train.images)[indices].astype(np.float32) / 255
    assert gathered.shape == (2, 3, 28, 28, 1)
    np.testing.assert_allclose(gathered, expected, rtol=1e-6)
    raw = jax.jit(data.gather_normalised)(omniglot_train.images, indices[::-1])
    np.testing.assert_allclose(raw, expected[::-1], rtol=1e-6)


def test_missing_zips_name_the_files(tmp_path, omniglot_dir):
    with pytest.raises(DatasetNotFoundError, match="images_background_small1.zip"):
        data.load_split("omniglot/small", "train", data_dir=str(tmp_path / "tfds"),
                        manual_dir=str(tmp_path))
    with pytest.raises(DatasetNotFoundError,
                       match="^--manual_dir=/.*: images_background.zip, images_evaluation.zip "
                             "not found there"):
        data.load_split("omniglot/full", "train", data_dir=str(tmp_path / "tfds"),
                        manual_dir=omniglot_dir)
    with pytest.raises(DatasetNotFoundError, match="SlimageNet64.tar.bz2 not found in"):
        data.load_split("slimagenet64", "train", data_dir=str(tmp_path / "tfds"),
                        manual_dir=str(tmp_path))


def _assert_nothing_prepared(data_dir):
    """No Omniglot config of ``data_dir`` has the file that marks it prepared (read from the
    folder: a TFDS builder of an unprepared config leaves an empty ``$TMPDIR/tmp*tfds``)."""
    assert glob.glob(os.path.join(data_dir, "cfsl_omniglot", "*", "*", "dataset_info.json")) == []


def test_preparing_or_refusing_a_dataset_leaves_nothing_in_tmpdir(tmp_path, monkeypatch,
                                                                  omniglot_dir, capfd):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    with pytest.raises(DatasetNotFoundError):  # an unprepared config, the zips missing
        data.load_split("omniglot/small", "train", data_dir=str(tmp_path / "none"),
                        manual_dir=str(temporary))
    capfd.readouterr()
    prepared = data.load_split("omniglot/small", "val", data_dir=str(tmp_path / "tfds"),
                               manual_dir=omniglot_dir)
    assert prepared.info.num_classes == 31
    out, err = capfd.readouterr()  # our lines only: no TFDS banner, no tqdm bar
    # A "still [data] preparing ... (10.1s)" heartbeat appears when preparing takes over
    # progress.HEARTBEAT_S (a loaded machine); it is ours too, and not what is compared.
    assert [line.split(" (once)")[0] for line in out.splitlines()
            if not line.startswith("still ")] == [
        f"[data] preparing omniglot/small_nearest in {tmp_path / 'tfds'}"] * 2, out
    assert "Downloading" not in err and "\r" not in err and "it/s" not in err, err
    assert os.listdir(temporary) == [] and sorted(os.listdir(tmp_path)) == ["tfds", "tmp"]
    assert not glob.glob(str(tmp_path / "tfds" / ".cfsl-tmp-*"))
    _assert_nothing_prepared(str(tmp_path / "none"))
    assert os.listdir(temporary) == []  # the check above reads the folder only


def test_corrupt_zips_are_refused_and_leave_nothing_prepared(tmp_path, omniglot_dir):
    manual = tmp_path / "manual"
    manual.mkdir()
    shutil.copy(os.path.join(omniglot_dir, "images_background_small2.zip"), manual)
    # A truncated archive.
    raw = open(os.path.join(omniglot_dir, "images_background_small1.zip"), "rb").read()
    (manual / "images_background_small1.zip").write_bytes(raw[: len(raw) // 2])
    tfds_dir = str(tmp_path / "tfds")
    with pytest.raises(CorruptDatasetError, match="images_background_small1.zip"):
        data.load_split("omniglot/small", "train", data_dir=tfds_dir, manual_dir=str(manual))
    _assert_nothing_prepared(tfds_dir)
    # A character with a drawing missing.
    with zipfile.ZipFile(os.path.join(omniglot_dir, "images_background_small1.zip")) as source, \
            zipfile.ZipFile(manual / "images_background_small1.zip", "w") as target:
        names = [n for n in source.namelist() if n.endswith(".png")]
        for name in names[1:]:
            target.writestr(name, source.read(name))
    with pytest.raises(CorruptDatasetError, match="has 19 drawings, expected 20"):
        data.load_split("omniglot/small", "train", data_dir=tfds_dir, manual_dir=str(manual))
    _assert_nothing_prepared(tfds_dir)


def test_bad_names_and_options_list_the_valid_values():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; valid: .*synthetic"):
        data.load_split("mnist", "train")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        data.load_split("synthetic", "dev")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['classes'\]"):
        data.load_split("synthetic", "train", classes=3)


def _copy_zip(source_path, target_path, replace=None):
    """Copies a zip member by member, replacing the members named in ``replace``."""
    with zipfile.ZipFile(source_path) as source, zipfile.ZipFile(target_path, "w") as target:
        for name in source.namelist():
            target.writestr(name, (replace or {}).get(name, source.read(name)))


def _assert_no_leftovers(data_dir):
    for _, folders, files in os.walk(data_dir):
        assert not [n for n in folders + files if n.startswith("incomplete.")]


def test_unreadable_zips_are_refused(tmp_path, omniglot_dir):
    manual = tmp_path / "manual"
    manual.mkdir()
    shutil.copy(os.path.join(omniglot_dir, "images_background_small2.zip"), manual)
    small1 = manual / "images_background_small1.zip"
    tfds_dir = str(tmp_path / "tfds")
    load = lambda: data.load_split("omniglot/small", "train", data_dir=tfds_dir,
                                   manual_dir=str(manual))
    small1.write_bytes(b"this is not a zip archive" * 100)
    with pytest.raises(CorruptDatasetError, match="images_background_small1.zip: not a readable zip"):
        load()
    # A damaged member: its compressed bytes flipped (bad CRC or bad deflate data).
    raw = bytearray(open(os.path.join(omniglot_dir, "images_background_small1.zip"), "rb").read())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as archive:
        info = [i for i in archive.infolist() if i.filename.endswith(".png")][7]
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for offset in range(start + 10, start + 20):
        raw[offset] ^= 0xFF
    small1.write_bytes(bytes(raw))
    with pytest.raises(CorruptDatasetError, match="images_background_small1.zip"):
        load()
    # An intact zip holding an undecodable PNG.
    source = os.path.join(omniglot_dir, "images_background_small1.zip")
    _copy_zip(source, small1, {info.filename: b"not a png"})
    with pytest.raises(CorruptDatasetError,
                       match="images_background_small1.zip: .*png: undecodable PNG"):
        load()
    # The wrong zip under the expected name: 156 characters where 136 are expected.
    shutil.copy(os.path.join(omniglot_dir, "images_background_small2.zip"), small1)
    with pytest.raises(CorruptDatasetError, match="holds 156 characters, expected 136"):
        load()
    _assert_nothing_prepared(tfds_dir)
    _assert_no_leftovers(tfds_dir)
    # Plain "omniglot" finds nothing prepared after the failures.
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError, match="images_background.zip and images_evaluation.zip"):
        data.load_split("omniglot", "train", data_dir=tfds_dir, manual_dir=str(empty))


def _tar(path, entries):
    """entries: name -> bytes (a file) or None (a directory)."""
    with tarfile.open(path, "w:bz2") as archive:
        for name, payload in entries.items():
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))


def test_corrupt_slimagenet_archives_are_refused(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    path, _ = make_slimagenet_archive(str(manual))
    tfds_dir = str(tmp_path / "tfds")
    load = lambda: data.load_split("slimagenet64", "train", data_dir=tfds_dir,
                                   manual_dir=str(manual))
    raw = open(path, "rb").read()
    with open(path, "wb") as handle:
        handle.write(raw[: len(raw) // 2])
    with pytest.raises(CorruptDatasetError, match="SlimageNet64.tar.bz2: cannot read the archive"):
        load()
    image = _png(np.zeros((64, 64, 3), np.uint8))
    full = {f"SlimageNet64/{s}/c{s}/0.png": image for s in data.SPLITS}
    _tar(path, {**full, "SlimageNet64/val/empty_class": None})
    with pytest.raises(CorruptDatasetError, match="class val/empty_class has no images"):
        load()
    _tar(path, {k: v for k, v in full.items() if "/test/" not in k})
    with pytest.raises(CorruptDatasetError, match="split 'test' has no classes"):
        load()
    _tar(path, {**full, "SlimageNet64/train/ctrain/1.jpg": b"garbage"})
    with pytest.raises(CorruptDatasetError, match="undecodable image"):
        load()
    assert not os.path.exists(os.path.join(tfds_dir, "cfsl_slimagenet64", "1.0.0"))
    _assert_no_leftovers(tfds_dir)
    # A 32x32 greyscale image is converted to RGB and resized; non-image files are ignored.
    small = _png(np.full((32, 32), 200, np.uint8))
    _tar(path, {**full, "SlimageNet64/train/ctrain/1.png": small,
                "SlimageNet64/train/ctrain/notes.txt": b"hello", "SlimageNet64/README": b"x"})
    loaded = load()
    assert loaded.images.shape == (2, 64, 64, 3)
    np.testing.assert_array_equal(loaded.images[1], np.full((64, 64, 3), 200, np.uint8))


def test_synthetic_tfds_builder_matches_the_in_memory_set(tmp_path):
    config = synthetic.SyntheticConfig(name="tiny", num_classes=10, samples_per_class=3,
                                       image_size=16, seed=3)
    builder = synthetic.CfslSynthetic(config=config, data_dir=str(tmp_path),
                                      file_format="array_record")
    builder.download_and_prepare()
    images, _ = synthetic.generate(10, 3, 16, seed=3)
    counts = {"train": 7, "val": 1, "test": 2}
    assert split_class_counts(10) == counts
    first = 0
    for split, count in counts.items():
        source = builder.as_data_source(split=split)
        records = sorted(source.__getitems__(list(range(len(source)))),
                         key=lambda r: (r["label"], r["drawing"]))
        assert len(records) == 3 * count
        np.testing.assert_array_equal(np.stack([r["image"] for r in records]),
                                      images[3 * first:3 * (first + count)])
        assert records[0]["class_name"] == synthetic.class_name(first).encode()
        first += count


def test_offline_omniglot_without_manual_dir_fails_at_once_and_creates_nothing(tmp_path):
    """Nothing prepared, no --manual_dir, no --download: one message naming the zips and where
    to put them, raised before anything is created (no network, no empty folders)."""
    from cfsl_jax.runtime.errors import UserError

    tfds_dir = tmp_path / "fresh" / "tfds"
    started = time.perf_counter()
    for name, zips in (("omniglot", "images_background.zip and images_evaluation.zip"),
                       ("omniglot/full", "images_background.zip and images_evaluation.zip"),
                       ("omniglot/small", "images_background_small1.zip and "
                                          "images_background_small2.zip")):
        with pytest.raises(DatasetNotFoundError, match=f"not prepared in .*put {zips} .* pass "
                                                       f"it as --manual_dir, or pass --download"):
            data.load_split(name, "train", data_dir=str(tfds_dir))
    assert time.perf_counter() - started < 30  # no download attempt (that retries for minutes)
    assert not (tmp_path / "fresh").exists()
    # The CLI boundary catches it as a user error (and it is still a FileNotFoundError).
    assert issubclass(DatasetNotFoundError, UserError) and issubclass(CorruptDatasetError, UserError)
    assert issubclass(DatasetNotFoundError, FileNotFoundError)


def test_a_failed_preparation_removes_the_folders_it_created(tmp_path, monkeypatch):
    """Whatever fails inside TFDS's preparation (here: a download that creates its folders,
    then breaks), the folders that did not exist before are removed; existing ones stay."""
    from cfsl_jax.datasets.omniglot import CfslOmniglot

    existing = tmp_path / "tfds"
    existing.mkdir()
    (existing / "keep.txt").write_text("a file of the user's")

    def broken_prepare(self, download_config=None):
        os.makedirs(os.path.join(self.data_dir, "incomplete.x"))
        os.makedirs(existing / "downloads" / "manual" / "partial")
        raise OSError("network is unreachable")

    monkeypatch.setattr(CfslOmniglot, "download_and_prepare", broken_prepare)
    with pytest.raises(OSError, match="unreachable"):
        data.load_split("omniglot/full", "train", data_dir=str(existing), download=True)
    assert sorted(os.listdir(existing)) == ["keep.txt"]


@pytest.fixture(scope="module")
def omniglot_full_names():
    """The 1623 "alphabet/character" names of the full zips (read from their listings only)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                          "shared", "data", "omniglot_full")
    names = []
    for zip_name in ("images_background.zip", "images_evaluation.zip"):
        path = os.path.join(folder, zip_name)
        if not os.path.isfile(path):
            pytest.skip(f"full Omniglot is not in {folder}")
        with zipfile.ZipFile(path) as archive:
            names += sorted({"/".join(m.split("/")[-3:-1]) for m in archive.namelist()
                             if m.endswith(".png")})
    return names


def test_authors_class_split_of_full_omniglot(omniglot_full_names):
    """The authors' split (RandomState(100) over the sorted "alphabet/character" names; commit
    5b814ac utils/dataset_tools.py): 1200/211/212, disjoint, pinned first classes."""
    from cfsl_jax.datasets.omniglot import authors_split

    split = authors_split(omniglot_full_names)
    assert {k: len(v) for k, v in split.items()} == {"train": 1200, "val": 211, "test": 212}
    assert sorted(split["train"] + split["val"] + split["test"]) == sorted(omniglot_full_names)
    assert split["train"][:3] == ["Avesta/character22", "Grantha/character09",
                                  "Atlantean/character03"]
    assert split["val"][:2] == ["Malayalam/character26", "Armenian/character26"]
    assert split["test"][:2] == ["Armenian/character19", "Tengwar/character11"]
    # The order the names come in does not matter (the authors sort them first).
    assert authors_split(list(reversed(omniglot_full_names))) == split
    # Unlike the default alphabet-ordered split, every split mixes alphabets.
    assert len({n.split("/")[0] for n in split["test"]}) == 50
    with pytest.raises(ValueError, match="1623 distinct characters of omniglot/full, got 242"):
        authors_split(omniglot_full_names[:242])


def test_select_classes_relabels_in_the_chosen_order(omniglot_splits):
    """The resplitting behind class_split="authors", on real mini-Omniglot: the chosen classes'
    images, in the chosen order, relabelled 0.., drawings in order."""
    parts = [omniglot_splits[name] for name in data.SPLITS]
    images = np.concatenate([np.asarray(p.images) for p in parts])
    names = tuple(n for p in parts for n in p.info.class_names)
    offsets = np.cumsum([0] + [p.info.num_classes for p in parts[:-1]])
    labels = np.concatenate([np.repeat(np.arange(p.info.num_classes), 20) + o
                             for p, o in zip(parts, offsets)])
    chosen = [names[200], names[3], names[190]]  # a test, a train and a val class
    picked, new_labels = data.select_classes(images, labels, names, chosen)
    assert picked.shape == (60, 28, 28, 1)
    np.testing.assert_array_equal(new_labels, np.repeat([0, 1, 2], 20))
    for position, name in enumerate(chosen):
        c = names.index(name)
        np.testing.assert_array_equal(picked[20 * position:20 * position + 20],
                                      images[labels == c])


def test_authors_class_split_option_is_checked(tmp_path):
    from cfsl_jax.runtime.errors import UserError

    with pytest.raises(UserError, match=r"class_split='shuffled'.*valid: \('ordered', 'authors'\)"):
        data.load_split("omniglot/full", "train", data_dir=str(tmp_path), class_split="shuffled")
    with pytest.raises(UserError, match="omniglot/small has 242"):
        data.load_split("omniglot/small", "train", data_dir=str(tmp_path), class_split="authors")
    with pytest.raises(UserError,
                       match=r"unknown option\(s\) \['seed'\].*valid: \('class_split', 'resize'\)"):
        data.load_split("omniglot/small", "train", data_dir=str(tmp_path), seed=1)


def test_a_damaged_prepared_dataset_is_refused_in_one_line(tmp_path, omniglot_dir):
    """A prepared folder with a record file deleted, cut short or its dataset_info.json
    edited is a CorruptDatasetError naming the folder (one line, no traceback), not
    array_record's RuntimeError or protobuf's ParseError."""
    prepared_dir = str(tmp_path / "prepared")
    data.load_split("omniglot/small", "val", data_dir=prepared_dir, manual_dir=omniglot_dir)
    version = os.path.join("cfsl_omniglot", "small_nearest", "1.0.0")
    records = "cfsl_omniglot-{}.array_record-00000-of-00001"

    def damaged(name, damage):
        copy = str(tmp_path / name)
        shutil.copytree(prepared_dir, copy)
        damage(os.path.join(copy, version))
        return copy

    cases = {
        "deleted": lambda d: os.remove(os.path.join(d, records.format("test"))),
        "truncated": lambda d: os.truncate(os.path.join(d, records.format("test")), 50_000),
        "info": lambda d: open(os.path.join(d, "dataset_info.json"), "w").write("{"),
    }
    for name, damage in cases.items():
        copy = damaged(name, damage)
        for dataset in ("omniglot/small", "omniglot"):  # plain omniglot probes what is prepared
            with pytest.raises(CorruptDatasetError,
                               match=f"prepared in {os.path.join(copy, version)} cannot be read"
                                     f".*delete {os.path.join(copy, version)} and run again"):
                data.load_split(dataset, "test", data_dir=copy)


def test_a_prepared_split_file_replaced_by_another_is_refused(tmp_path, omniglot_dir):
    """The val records replaced by the test split's file (an edited prepared folder): read
    as they are, val would silently be the first 620 test images (test classes used for
    model selection); the file holds 640 records where dataset_info.json records 620."""
    prepared_dir = str(tmp_path / "prepared")
    data.load_split("omniglot/small", "val", data_dir=prepared_dir, manual_dir=omniglot_dir)
    version = os.path.join(prepared_dir, "cfsl_omniglot", "small_nearest", "1.0.0")
    records = os.path.join(version, "cfsl_omniglot-{}.array_record-00000-of-00001")
    shutil.copy(records.format("test"), records.format("val"))
    with pytest.raises(CorruptDatasetError, match=f"prepared in {version} cannot be read: its "
                                                  "val files hold 640 records.* 620"):
        data.load_split("omniglot/small", "val", data_dir=prepared_dir)
