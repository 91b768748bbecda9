"""Shared fixtures: the real mini-Omniglot (prepared once per session) and small synthetic splits.

The test process sees 8 CPU devices (``--xla_force_host_platform_device_count``,
set here before any backend starts), so every training and evaluation test
runs sharded over a mesh of 8, and tests/test_parallel.py compares it with 1.
"""

import os

FAKE_DEVICES = 8
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                               f"device_count={FAKE_DEVICES}").strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest

from cfsl_jax import data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OMNIGLOT_DIR = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "omniglot"))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """A persistent XLA cache private to the session: runs that rebuild the same program (a
    resumed training run, a second learner instance) load it instead of compiling again."""
    jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("xla_cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def omniglot_dir():
    """The two small background zips (242 distinct characters); tests never download."""
    if not os.path.isfile(os.path.join(OMNIGLOT_DIR, "images_background_small1.zip")):
        pytest.fail(f"the shared Omniglot zips are missing from {OMNIGLOT_DIR}")
    return OMNIGLOT_DIR


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A TFDS data_dir private to this test session."""
    return str(tmp_path_factory.mktemp("tensorflow_datasets"))


@pytest.fixture(scope="session")
def omniglot_train(omniglot_dir, data_dir):
    return data.load_split("omniglot", "train", data_dir=data_dir, manual_dir=omniglot_dir)


@pytest.fixture(scope="session")
def omniglot_splits(omniglot_dir, data_dir):
    return {split: data.load_split("omniglot", split, data_dir=data_dir, manual_dir=omniglot_dir)
            for split in data.SPLITS}
