"""Shared fixtures: the real mini-Omniglot (prepared once per session) and small synthetic splits.

The suite passes on any backend (CPU in CI, a GPU or TPU too):

- The process sees 8 CPU devices (``--xla_force_host_platform_device_count``, set
  here before any backend starts) on every machine; multi-device tests build
  their meshes from them with ``cpu_mesh(n)``, never from ``jax.devices()``.
  Tests that use the default mesh run on the default backend's devices (8 on
  CPU, so training and evaluation run sharded; the GPU's count elsewhere).
- Float32 matmuls and convolutions run at ``highest`` precision (the
  ``--precision`` policy, ``cfsl_jax.runtime.backend``), here and in subprocesses, so
  tolerances mean the same on CPU and on a TF32 GPU; tests of the policy itself
  set it explicitly.
- MACs are XLA:CPU's count on every backend (``backend.cpu_cost_analysis``).
- In-process tests compile at -O0 (``jax_disable_most_optimizations``), and so do the
  commands tests start where what they check does not depend on the level
  (``unoptimised_env()``); ``CFSL_TEST_FULL_OPT=1``: everything at XLA's default level.
- XLA:CPU compiles with its elemental emitters (``--xla_cpu_use_fusion_emitters=false``,
  where this XLA has the flag), here and in subprocesses: the suite is mostly compiling, and
  they compile its programs 1.5-3x faster.

``pytest`` runs the modules in three pytest-xdist worker processes (``-n 3 --dist loadfile``
in pyproject.toml: a module's tests and fixtures stay in one worker); ``pytest -n 0`` runs
everything in one process. The workers share one persistent compilation cache; a module's
tests share their compiled programs, which are released after the module (or after a test
that leaves the worker above 2 GB resident).
"""

import contextlib
import ctypes
import gc
import os
import subprocess
import sys
from typing import Iterator

FAKE_DEVICES = 8
# XLA:CPU's fusion emitters compile the suite's small programs 1.5-3x slower than its
# elemental emitters (the same HLO, so the same MACs; results agree to float rounding). The
# flag exists in the tested jaxlib (0.10.2) but not in every version (0.11.2 aborts on it), so
# a subprocess asks this XLA first; pytest-xdist's workers inherit the answer in XLA_FLAGS.
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_knows(flag: str) -> bool:
    probe = "import jax; jax.devices('cpu')"
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          timeout=120).returncode == 0


if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                               f"device_count={FAKE_DEVICES}").strip()
if "CFSL_TEST_XLA_PROBED" not in os.environ:  # once per session: workers inherit the answer
    os.environ["CFSL_TEST_XLA_PROBED"] = "1"
    if ELEMENTAL_EMITTERS not in os.environ["XLA_FLAGS"] and _xla_knows(ELEMENTAL_EMITTERS):
        os.environ["XLA_FLAGS"] += f" {ELEMENTAL_EMITTERS}"
TEST_PRECISION = "highest"
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = TEST_PRECISION  # also for subprocesses

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest

from cfsl_jax.runtime import backend, parallel
from cfsl_jax import data
from cfsl_jax.fluid import StreamConfig
from cfsl_jax.training import train

backend.set_precision(TEST_PRECISION)
# In-process tests compile without XLA's optimisations (-O0): compiling dominates the
# suite's small programs and -O0 compiles 2-3x faster; results agree to float rounding, and
# MACs (XLA's cost analysis) are the same at either level. CFSL_TEST_FULL_OPT=1: everything
# at the default level, command-line tests included.
UNOPTIMISED = not os.environ.get("CFSL_TEST_FULL_OPT")
jax.config.update("jax_disable_most_optimizations", UNOPTIMISED)
# Command-line tests whose property does not depend on the optimisation level (a stopped
# command resumes to the uninterrupted numbers computed at the same level; error lines, files,
# progress lines) start their commands at -O0 too, with ``env=unoptimised_env()`` (jax reads
# JAX_DISABLE_MOST_OPTIMIZATIONS at import). The main training command (test_cli's SIGTERM
# test) and the FLUID study keep the default level, as a user's command runs.


def unoptimised_env(**extra: str) -> dict[str, str]:
    """This process's environment for a command that compiles at -O0 (the default level with
    CFSL_TEST_FULL_OPT=1), plus ``extra``."""
    return {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "1" if UNOPTIMISED else "0",
            **extra}


def compile_unoptimised(unoptimised: bool) -> None:
    """From here on this process compiles at -O0 (True) or at XLA's default level. jax's
    in-memory caches do not tell the levels apart, and a module's tests share them: a change of
    level drops them, so no program compiled at the other level is reused."""
    if jax.config.values["jax_disable_most_optimizations"] != unoptimised:
        jax.config.update("jax_disable_most_optimizations", unoptimised)
        jax.clear_caches()


@pytest.fixture
def optimised_training_step(monkeypatch):
    """This test compiles train_and_evaluate's meta-training step at XLA's default level and
    everything else (data, initial parameters, evaluation) at the suite's -O0: a learning test
    whose run time is its training steps (ProtoNets' 30 steps of B3 on Omniglot: 10 s instead
    of 95 s) and whose other programs run a few times (measured in that test: data and initial
    parameters 4 s instead of 39 s, each evaluation program compiled in 3 s instead of 11 s)."""
    compile_step = train.compile_train_step

    def optimised(*args, **kwargs):
        compile_unoptimised(False)
        try:
            return compile_step(*args, **kwargs)
        finally:
            compile_unoptimised(UNOPTIMISED)

    monkeypatch.setattr(train, "compile_train_step", optimised)


def init_params(learner, key, example_x, spec):
    """``learner.init_params`` as one jitted program, as training draws them
    (``runs.init_params``): the same values, bit for bit, as op by op (checked for every
    learner), compiled in a fraction of the time (at -O0, first call in a process: ProtoNets
    1.7 s instead of 5.2 s, SCA 7.6 s instead of 21.8 s; each module pays it again, as its
    programs are dropped between modules)."""
    return jax.jit(learner.init_params, static_argnums=2)(key, example_x, spec)


def cpu_mesh(num_devices: int | None = None):
    """A ``"tasks"`` mesh over the first ``num_devices`` of the 8 CPU devices, on any backend."""
    return parallel.make_mesh(num_devices, devices=jax.devices("cpu"))

@contextlib.contextmanager
def traces_counted() -> Iterator[list[int]]:
    """``[n]``: the programs jax traced inside the block (jax.monitoring's public trace event;
    a jit cache hit traces nothing)."""
    count = [0]

    def on_duration(event: str, seconds: float, **_) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)


# The tiny sweep of test_sweep_report and the notebooks: TrainConfig fields, per-learner
# options, and the jax options of its worker processes.
TINY_SWEEP = dict(
    learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8},
    spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=3, meta_batch=2,
    val_tasks=4, test_tasks=4, eval_batch=4, keep_best=2, log_every=2)
TINY_SWEEP_LEARNER_OPTIONS = {"init_tune": {"inner_steps": 1}}
# A FLUID run of seconds (tests/test_fluid_sealed.py, tests/test_verify_fluid.py): one stream
# of 90 samples and one validation stream, NCM, on a small synthetic set (FluidConfig fields).
TINY_FLUID_NEW_CLASS = dict(methods=("ncm",), stream=StreamConfig(
    num_classes=6, length=90, pretrain_fraction=0.25, head_threshold=15, min_pretrain_samples=5,
    pretrain_classes=6), num_streams=1, validation_streams=1, pretrain_steps=3, filters=8,
    dataset_options={"num_classes": 20, "samples_per_class": 30, "image_size": 16})
WORKER_JAX_OPTIONS = {"jax_disable_most_optimizations": True,
                      "jax_persistent_cache_min_compile_time_secs": 0.0}


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


# The order modules are handed to the workers (``--no-loadscope-reorder``): the longest
# first, so that no long module starts last while the other worker idles, and the notebooks
# after the sweep tests, whose programs (same settings, one persistent cache) they then load.
# (test_packing, test_reference and test_fluid_experiment, each minutes long, were handed out
# among the last 20% of the tests and ran on while the other workers were done.)
MODULES_FIRST = ("test_sweep_report.py", "test_stops.py", "test_integrity.py", "test_maml.py",
                 "test_packing.py", "test_parallel.py", "test_train.py", "test_slurm.py",
                 "test_finetune.py", "test_fluid_methods.py", "test_reference.py",
                 "test_fluid_experiment.py", "test_sampler.py", "test_cloud_paths.py",
                 "test_cli.py", "test_metrics.py", "test_pretrain.py", "test_conv.py")
MODULES_LAST = ("test_notebooks.py",)


def pytest_collection_modifyitems(items):
    def rank(item):
        module = item.path.name
        if module in MODULES_FIRST:
            return MODULES_FIRST.index(module)
        return len(MODULES_FIRST) + 1 if module in MODULES_LAST else len(MODULES_FIRST)

    items.sort(key=rank)  # stable: each module's own order is kept


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OMNIGLOT_DIR = os.path.normpath(os.path.join(REPO, "..", "shared", "data", "omniglot"))


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """A persistent XLA cache private to the test run and shared by its pytest-xdist workers
    (and the subprocesses they start): runs that rebuild the same program (a resumed training
    run, a second learner instance, a notebook after the sweep test) load it instead of
    compiling again. Entries are written once per key; jax recompiles on an unreadable one.
    Commands run as subprocesses keep their own default cache (``$XDG_CACHE_HOME``), which is
    here a folder of the test run too: a test never writes into the user's ``~/.cache``."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's temporary root, above every worker's own folder
    backend.enable_compilation_cache(str(root / "xla_cache"))
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg_cache")


try:  # glibc (Linux); elsewhere freed heap is left to the platform's allocator
    _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):
    _MALLOC_TRIM = None


def _release_memory() -> None:
    """Drop jax's in-memory caches of traced and compiled programs and give freed heap back to
    the OS (glibc keeps freed pages in its arenas otherwise: RSS would only grow)."""
    jax.clear_caches()
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


_PROCESS_SETTINGS = ("jax_default_matmul_precision", "jax_compilation_cache_dir",
                     "jax_persistent_cache_min_compile_time_secs",
                     "jax_persistent_cache_min_entry_size_bytes",
                     "jax_disable_most_optimizations")


@pytest.fixture(autouse=True)
def process_settings_restored():
    """A command run in this process (``launch_inprocess``) sets the precision and the
    compilation cache as a user's command does (``default``, the home cache): after each test,
    JAX's process-wide settings are as they were, so the next test still computes at
    ``highest`` (on a TF32 GPU the difference is ~1e-4) and caches in the test run's folder."""
    before = {name: jax.config.values[name] for name in _PROCESS_SETTINGS}
    yield
    for name, value in before.items():
        if name == "jax_disable_most_optimizations":
            compile_unoptimised(value)
        elif jax.config.values[name] != value:
            jax.config.update(name, value)


# A worker's resident memory above which a test's programs are released at once, not at the
# end of its module (after a module, always): a module's tests share their compiled programs
# (the library keeps one learner, optimiser, training step and evaluation program per settings
# per process), and no worker holds more than about this plus one test's programs.
RELEASE_ABOVE_BYTES = 2_000_000_000


def _resident_bytes() -> int | None:
    """This process's resident memory now (Linux's /proc); None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """After each module, its programs are dropped (a later module that needs one again reads
    it from the persistent cache): the session holds one module's programs at a time, not the
    whole suite's (several GB). Tests that change what jax traces without changing a program's
    arguments (a module constant read at trace time) clear jax's caches around the change."""
    yield
    _release_memory()


@pytest.fixture(autouse=True)
def memory_bounded():
    """After a test that leaves the worker above ``RELEASE_ABOVE_BYTES`` (or where its memory
    cannot be read), its programs are dropped at once."""
    yield
    resident = _resident_bytes()
    if resident is None or resident > RELEASE_ABOVE_BYTES:
        _release_memory()


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
