"""Shared fixtures: the real mini-Omniglot (prepared once per session) and small synthetic splits.

The suite passes on any backend (CPU in CI, a GPU or TPU too):

- The process sees 8 CPU devices (``--xla_force_host_platform_device_count``, set
  here before any backend starts) on every machine; multi-device tests build
  their meshes from them with ``cpu_mesh(n)``, never from ``jax.devices()``.
  Tests that use the default mesh run on the default backend's devices (8 on
  CPU, so training and evaluation run sharded; the GPU's count elsewhere).
- Float32 matmuls and convolutions run at ``highest`` precision (the
  ``--precision`` policy, ``cfsl_jax.backend``), here and in subprocesses, so
  tolerances mean the same on CPU and on a TF32 GPU; tests of the policy itself
  set it explicitly.
- MACs are XLA:CPU's count on every backend (``backend.cpu_cost_analysis``).
"""

import gc
import os
import sys

FAKE_DEVICES = 8
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                               f"device_count={FAKE_DEVICES}").strip()
TEST_PRECISION = "highest"
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = TEST_PRECISION  # also for subprocesses

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest

from cfsl_jax import backend, data, parallel

backend.set_precision(TEST_PRECISION)


def cpu_mesh(num_devices: int | None = None):
    """A ``"tasks"`` mesh over the first ``num_devices`` of the 8 CPU devices, on any backend."""
    return parallel.make_mesh(num_devices, devices=jax.devices("cpu"))

def interruptible_module(module: str, *args: str) -> list[str]:
    """The command line of ``python -m module args`` in which Ctrl-C raises KeyboardInterrupt,
    as from a terminal. A shell without job control starts background commands (``pytest &``)
    with SIGINT ignored, children inherit that, and Python raises KeyboardInterrupt only where
    SIGINT was not ignored when it started; the child restores the handler itself (no
    ``preexec_fn``, which is unsafe in a multithreaded parent such as jax's)."""
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', "
            "alter_sys=True)")
    return [sys.executable, "-c", code, *args]


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OMNIGLOT_DIR = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "omniglot"))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """A persistent XLA cache private to the session: runs that rebuild the same program (a
    resumed training run, a second learner instance) load it instead of compiling again."""
    backend.enable_compilation_cache(str(tmp_path_factory.mktemp("xla_cache")))


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """After each test module, jax's in-memory caches of traced and compiled programs are
    dropped (a later module that needs a program again reads it from the persistent cache):
    the session holds one module's programs at a time, not the whole suite's (several GB)."""
    yield
    jax.clear_caches()
    gc.collect()


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
