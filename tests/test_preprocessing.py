"""Preprocessing as the authors' by default, the previous one an option away: binary
nearest-neighbour Omniglot (LANCZOS greyscale with ``resize=lanczos``), ImageNet-normalised
SlimageNet64 (/255 only with ``normalisation=unit``); each variant in the data's identity, and
configs saved before the options existed read back as the images they were trained on."""

import io
import os
import tarfile
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cfsl_jax import data
from cfsl_jax.datasets.preprocessing import IMAGENET
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import runs
from cfsl_jax.training.config import TrainConfig, from_json
from cfsl_jax.training.evaluate import dataset_identity, task_fingerprint

# Row 10 of the first drawing of Balinese/character01 (train image 0 of omniglot/small).
NEAREST_ROW10 = [255] * 5 + [0] * 4 + [255] * 9 + [0, 255, 0] + [255] * 7
LANCZOS_ROW10 = [255, 255, 253, 254, 218, 10, 81, 81, 21, 246, 254, 254, 254, 253, 255, 252,
                 255, 184, 4, 113, 0, 179, 255, 251, 255, 255, 255, 255]


@pytest.fixture(scope="module")
def lanczos_train(omniglot_dir, data_dir):
    return data.load_split("omniglot/small", "train", data_dir=data_dir, manual_dir=omniglot_dir,
                           resize="lanczos")


def test_nearest_omniglot_is_binary_and_differs_from_lanczos(omniglot_train, lanczos_train):
    nearest, lanczos = np.asarray(omniglot_train.images), np.asarray(lanczos_train.images)
    assert nearest.shape == lanczos.shape == (179 * 20, 28, 28, 1)
    assert np.unique(nearest).tolist() == [0, 255]
    assert np.unique(lanczos).size == 256  # grey edges
    assert 0.2 < float(np.mean(nearest != lanczos)) < 0.25  # measured 0.218
    first, other = nearest[0, :, :, 0], lanczos[0, :, :, 0]
    assert first[10].tolist() == NEAREST_ROW10 and other[10].tolist() == LANCZOS_ROW10
    assert (int(first.sum()), int((first < 128).sum())) == (184110, 62)
    assert (int(other.sum()), int((other < 128).sum())) == (183411, 66)


def test_nearest_is_what_pillow_makes_of_the_1_bit_png_with_any_filter(omniglot_dir,
                                                                       omniglot_train):
    """torchvision's ``Resize((28, 28))`` asks PIL for BILINEAR; a mode "1" image resizes with
    NEAREST whatever is asked, so the default equals the authors' images."""
    with zipfile.ZipFile(os.path.join(omniglot_dir, "images_background_small1.zip")) as archive:
        member = sorted(m for m in archive.namelist()
                        if "/Balinese/character01/" in m and m.endswith(".png"))[0]
        image = Image.open(io.BytesIO(archive.read(member)))
    assert image.mode == "1" and image.size == (105, 105)
    for asked in (Image.Resampling.BILINEAR, Image.Resampling.LANCZOS):
        authors = np.asarray(image.resize((28, 28), asked).convert("L"))
        np.testing.assert_array_equal(authors, np.asarray(omniglot_train.images)[0, :, :, 0])


def test_the_variant_is_in_the_identity_results_and_prepared_folder(omniglot_splits, data_dir,
                                                                    lanczos_train):
    assert omniglot_splits["train"].info.dataset_variant == "omniglot/small_nearest"
    assert lanczos_train.info.dataset_variant == "omniglot/small"
    assert "[omniglot/small_nearest] train" in dataset_identity(omniglot_splits["train"])
    assert "[omniglot/small] train" in dataset_identity(lanczos_train)
    for config in ("small", "small_nearest"):
        assert os.path.isdir(os.path.join(data_dir, "cfsl_omniglot", config, "1.0.0"))
    spec = TrainConfig(task="B3").spec
    assert task_fingerprint(omniglot_splits["train"], spec, 4, 0) != task_fingerprint(
        lanczos_train, spec, 4, 0)  # the same task indices, other images


def test_a_config_saved_before_the_options_reads_back_as_the_old_images(omniglot_dir, data_dir):
    today = TrainConfig(dataset="omniglot/small", manual_dir=omniglot_dir, data_dir=data_dir)
    assert today.to_json()["dataset_options"] == {"resize": "nearest"}
    old = {k: v for k, v in today.to_json().items() if k != "dataset_options"}
    assert from_json(old).dataset_options == {"resize": "lanczos"}
    assert runs.config_differences(old, today) == ["dataset_options"]
    lanczos = TrainConfig(**{**today.to_json(), "dataset_options": {"resize": "lanczos"}})
    assert runs.config_differences(old, lanczos) == []
    # The old run's test tasks: the fingerprint the code before the option recorded.
    split = runs.load_splits(from_json(old))["test"]
    assert dataset_identity(split) == "omniglot/small [omniglot/small] test 32 classes 640 " \
                                      "images (28, 28, 1)"
    assert task_fingerprint(split, today.spec, 20, 0) == (
        "79ecda09a142e32a94cdbf75685780daeda5816f9b74a0065d058d625eb806ef")
    saved_slim = {"dataset": "slimagenet64", "dataset_options": {}}
    assert from_json(saved_slim).dataset_options == {"normalisation": "unit"}
    assert TrainConfig(dataset="slimagenet64").to_json()["dataset_options"] == {
        "normalisation": "imagenet"}
    assert TrainConfig().to_json()["dataset_options"] == {}  # synthetic: nothing to choose


def test_imagenet_normalisation_on_a_tiny_array():
    images = jnp.array([[[[0, 128, 255]]], [[[255, 51, 102]]]], jnp.uint8)  # [2, 1, 1, 3]
    info = data.SplitInfo("slimagenet64", "test", 1, 2, (1, 1, 3), ("a",), "fake", "fake",
                          IMAGENET)
    split = data.Split(images, jnp.array([[0, 1]]), jnp.array([2]), info)
    out = np.asarray(jax.jit(data.gather_normalised)(split, jnp.array([0, 1])))
    expected = [[-2.117904, 0.205182, 2.64], [2.248908, -1.142857, -0.026667]]
    np.testing.assert_allclose(out.reshape(2, 3), expected, rtol=1e-5, atol=1e-6)
    unit = data.Split(images, split.class_table, split.class_sizes,
                      data.SplitInfo(*[getattr(info, f) for f in ("dataset", "split",
                                       "num_classes", "num_images", "image_shape",
                                       "class_names", "source", "variant")]))
    np.testing.assert_allclose(np.asarray(data.gather_normalised(unit, jnp.array([1]))),
                               [[[[1.0, 0.2, 0.4]]]], rtol=1e-6)


def _tiny_slimagenet(folder):
    rng = np.random.default_rng(0)
    with tarfile.open(os.path.join(folder, "SlimageNet64.tar.bz2"), "w:bz2") as archive:
        for split in data.SPLITS:
            for i in range(2):
                buffer = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(
                    buffer, format="PNG")
                info = tarfile.TarInfo(f"SlimageNet64/{split}/n0/img{i}.png")
                info.size = len(buffer.getvalue())
                archive.addfile(info, io.BytesIO(buffer.getvalue()))


def test_slimagenet64_is_normalised_by_default_and_unit_is_an_option(tmp_path):
    (tmp_path / "manual").mkdir()
    _tiny_slimagenet(str(tmp_path / "manual"))
    paths = dict(data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "manual"))
    normalised = data.load_split("slimagenet64", "val", **paths)
    unit = data.load_split("slimagenet64", "val", normalisation="unit", **paths)
    assert normalised.info.dataset_variant == "slimagenet64/imagenet_norm"
    assert unit.info.dataset_variant == "slimagenet64" and unit.info.normalisation is None
    np.testing.assert_array_equal(normalised.images, unit.images)  # the same prepared images
    x, y = (np.asarray(data.gather_normalised(s, jnp.arange(2))) for s in (normalised, unit))
    np.testing.assert_allclose(x, (y - np.array(IMAGENET.mean)) / np.array(IMAGENET.std),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match=r"normalisation='none' for dataset 'slimagenet64'; "
                                        r"valid: \('imagenet', 'unit'\)"):
        data.load_split("slimagenet64", "val", normalisation="none", **paths)
    with pytest.raises(UserError, match=r"unknown option\(s\) \['resize'\]"):
        data.load_split("slimagenet64", "val", resize="nearest", **paths)
