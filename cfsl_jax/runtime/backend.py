"""Backend policy: the same numbers on every backend, one precision rule, compile once per machine.

Four rules, one place (docs/metrics.md says why for MACs and compile time):

- **MACs are XLA:CPU's count, on every backend.** ``counting_device()`` is the
  first CPU device; ``metrics.xla_macs`` compiles the program for it from
  abstract arguments placed there (nothing is copied) while
  ``lowering_platform()`` reads ``"cpu"``, so every trace-time choice that
  depends on the platform (``models.conv``'s "auto", ``scan_unroll``) takes
  its CPU branch. XLA:GPU's cost analysis does not count cuDNN convolutions,
  so the accelerator's own count is never used.
- **Precision.** ``--precision`` sets ``jax_default_matmul_precision`` for
  float32 matmuls and convolutions: ``default`` (the backend's fastest: TF32
  tensor cores on NVIDIA Ampere and later, one bf16 pass on TPU), ``high``
  (TF32 on GPU, three bf16 passes on TPU) or ``highest`` (full float32
  everywhere). The default is ``default``: the speed a user expects from an
  accelerator. XLA:CPU computes float32 exactly under all three, so CPU numbers
  do not depend on it; accelerator numbers differ from CPU's by float rounding
  under every choice, and by TF32's ~1e-3 relative error per product under
  ``default``/``high`` (well inside the run-to-run spread of the metrics, but
  not bit-identical to CPU). The tests run at ``highest`` (tests/conftest.py).
- **Compile once per machine.** ``enable_compilation_cache(path)`` turns on
  JAX's persistent compilation cache (command lines: ``--compilation_cache_dir``,
  default ``default_cache_dir()``; ``''`` disables it), so a re-run, a resume or
  the next sweep cell of the same shape loads its programs instead of compiling.
- **Compile seconds.** ``compile_seconds()`` is the time this process has spent
  turning jitted functions into executables: tracing, lowering to MLIR and the
  backend compile (or, on a cache hit, the cache read), from JAX's own
  monitoring events, counted from the first snapshot or ``configure`` on
  (``count_compiles``; importing registers no listener); ``results.json`` records it.

Trace-time platform choices read ``lowering_platform()``, never
``jax.default_backend()`` directly, so that a program counted (or run) on CPU
takes the CPU branch on a machine whose default backend is an accelerator.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import tempfile
from typing import Any, Iterator

import jax
from jax import monitoring
from jax.sharding import SingleDeviceSharding

from cfsl_jax.runtime import files
# the settings' names and defaults (no JAX: command lines define their flags from them)
from cfsl_jax.runtime.backend_options import DEFAULT_PRECISION, PRECISIONS, default_cache_dir
from cfsl_jax.runtime.errors import UserError

COUNTING_PLATFORM = "cpu"  # MACs are XLA:CPU's count wherever a run happens
SCAN_UNROLL_MAX = 4  # on accelerators, scans of at most this many steps are fully unrolled



class _ContextVar:
    """``jax.make_user_context``'s interface (``ctx.value``; ``with ctx(v):``) on a contextvar,
    for a jax without it (its value is then not in jit's cache key)."""

    def __init__(self, default_value: Any):
        self._var = contextvars.ContextVar("cfsl_jax", default=default_value)

    @property
    def value(self) -> Any:
        return self._var.get()

    @contextlib.contextmanager
    def __call__(self, value: Any) -> Iterator[None]:
        token = self._var.set(value)
        try:
            yield
        finally:
            self._var.reset(token)


# Trace-time choices read these; as jax user contexts their values are part of the key of jit's
# tracing, lowering and compilation caches, so a program traced for one platform, or to be
# counted, is never reused for another (a contextvar alone: jax reused the trace)
_make_context = getattr(jax, "make_user_context", _ContextVar)
_platform = _make_context(None)
_counting = _make_context(False)


# -- the platform a program is lowered for ---------------------------------------------------

def lowering_platform() -> str:
    """The platform trace-time choices are made for: ``lowering_for``'s, else the default backend's."""
    return _platform.value or jax.default_backend()


@contextlib.contextmanager
def lowering_for(platform: str) -> Iterator[None]:
    """Within the block, trace-time choices are made for ``platform`` ("cpu", "gpu", "tpu")."""
    with _platform(platform):
        yield


def counting() -> bool:
    """Whether a program is being traced to count its MACs (``cpu_cost_analysis``): trace-time
    choices that change the count but not the function (the convolution's implementation)
    take their counting branch."""
    return bool(_counting.value)


def is_accelerator(platform: str | None = None) -> bool:
    """Whether ``platform`` (default: ``lowering_platform()``) is not the CPU."""
    return (platform or lowering_platform()) != "cpu"


def scan_unroll(length: int) -> int:
    """``lax.scan``'s unroll for a scan of ``length`` steps: 1 on CPU (a rolled loop, as
    always); the whole scan on an accelerator when ``length <= SCAN_UNROLL_MAX`` (no
    while-loop predicate copied to the host per step, fewer kernel launches)."""
    if is_accelerator() and 1 < length <= SCAN_UNROLL_MAX:
        return length
    return 1


# -- MACs: counted by XLA:CPU ------------------------------------------------------------------

def counting_device() -> jax.Device:
    """The CPU device MACs are counted on (present with every jaxlib unless JAX_PLATFORMS drops it)."""
    try:
        return jax.devices(COUNTING_PLATFORM)[0]
    except RuntimeError as error:
        raise RuntimeError(
            f"MACs are counted by XLA:CPU, but the cpu backend is not initialised "
            f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')!r}); add cpu, e.g. "
            f"JAX_PLATFORMS=cuda,cpu") from error


def abstract_on(tree: Any, device: jax.Device) -> Any:
    """``tree`` with every array replaced by a ShapeDtypeStruct placed on ``device``."""
    sharding = SingleDeviceSharding(device)

    def abstract(leaf):
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) or hasattr(leaf, "__array__"):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding,
                                        weak_type=getattr(leaf, "weak_type", False))
        return leaf

    return jax.tree.map(abstract, tree)


def cpu_cost_analysis(fn, *args, **kwargs) -> dict[str, float]:
    """XLA:CPU's cost analysis of ``jit(fn)(*args, **kwargs)``, whatever the default backend."""
    device = counting_device()
    args, kwargs = abstract_on((args, kwargs), device)
    with _counting(True), lowering_for(COUNTING_PLATFORM), jax.default_device(device):
        compiled = jax.jit(fn).lower(*args, **kwargs).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0]
    if analysis is None:
        raise RuntimeError(f"XLA:CPU gave no cost analysis for {getattr(fn, '__name__', fn)}")
    return analysis


# -- precision -------------------------------------------------------------------------------

def set_precision(name: str) -> None:
    """Float32 matmul/convolution precision of every program traced after this call."""
    if name not in PRECISIONS:
        raise UserError(f"precision={name!r}: choose one of {', '.join(PRECISIONS)}")
    jax.config.update("jax_default_matmul_precision", None if name == "default" else name)


def precision() -> str:
    """The precision in force: one of ``PRECISIONS`` (JAX's own names map to the nearest)."""
    value = jax.config.jax_default_matmul_precision
    if value is None or value in ("default", "bfloat16", "fastest"):
        return "default"
    return "highest" if value in ("highest", "float32") else "high"


# -- the persistent compilation cache and compile seconds -----------------------------------------

def cache_dir_in(folder: str) -> str:
    """The compilation cache of a command writing into ``folder``: ``folder/xla_cache`` when
    ``folder`` is local (absolute), the machine's ``default_cache_dir()`` when it is a URL
    (each machine compiles for itself, and a local cache is read in milliseconds)."""
    if files.is_url(folder):
        return default_cache_dir()
    return files.absolute(files.join(folder, "xla_cache"))


def enable_compilation_cache(path: str | None) -> str | None:
    """Cache every compiled program under ``path`` (None or ``''``: no cache); returns it.

    Every program is cached, however fast it compiled: the many small ones of a
    run add up, and a cache read is milliseconds.
    """
    if not path:
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    path = files.absolute(os.path.expanduser(path))
    reason = None if files.is_url(path) else _unwritable(path)
    if reason:  # a cache is an optimisation: go on without one, and say how to keep one
        print(f"warning: the compilation cache folder {path} cannot be written ({reason}); "
              f"going on without a cache (every program is compiled afresh): give a writable "
              f"--compilation_cache_dir (or XDG_CACHE_HOME), or --compilation_cache_dir='' to "
              f"turn it off", file=sys.stderr, flush=True)
        jax.config.update("jax_compilation_cache_dir", None)
        return None
    files.makedirs(path)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _unwritable(folder: str) -> str | None:
    """Why ``folder`` cannot hold files (created when missing), or None when it can."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def configure(precision_name: str = DEFAULT_PRECISION,
              compilation_cache_dir: str | None = None) -> None:
    """What the command lines do first: the precision, the compilation cache, and counting
    compile seconds."""
    count_compiles()
    set_precision(precision_name)
    enable_compilation_cache(compilation_cache_dir)


_COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                   "/jax/core/compile/backend_compile_duration": "xla"}  # xla: or the cache read
_totals = {"seconds": 0.0, "cache_hits": 0, "trace": 0.0, "lower": 0.0, "xla": 0.0}


def _on_duration(event: str, seconds: float, **_) -> None:
    if event in _COMPILE_EVENTS:
        _totals["seconds"] += seconds
        _totals[_COMPILE_EVENTS[event]] += seconds


def _on_event(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _totals["cache_hits"] += 1


_listening: list[bool] = []


def count_compiles() -> None:
    """Start counting compile seconds and cache hits (jax.monitoring listeners), once; every
    reader of the counters calls it, so a run's first snapshot starts the count (importing
    this module registers nothing)."""
    if not _listening:
        monitoring.register_event_duration_secs_listener(_on_duration)
        monitoring.register_event_listener(_on_event)
        _listening.append(True)


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling (or loading) programs
    since the counting started (``count_compiles``)."""
    count_compiles()
    return _totals["seconds"]


def compile_totals() -> dict[str, float]:
    """A snapshot of this process's compile counters (``compile_stats(since=...)``)."""
    count_compiles()
    return dict(_totals)


def compile_stats(since: dict[str, float] | None = None) -> dict[str, Any]:
    """For results.json: compile seconds (total, and by stage: tracing, lowering, XLA compile or
    cache read), persistent-cache hits, the cache folder, the precision. ``since``: a
    ``compile_totals()`` snapshot (a run's start): only what was compiled after it counts."""
    count_compiles()
    since = since or dict.fromkeys(_totals, 0)
    spent = {name: value - since[name] for name, value in _totals.items()}
    return {"compile_seconds": round(spent["seconds"], 3),
            "compile_seconds_by_stage": {stage: round(spent[stage], 3)
                                         for stage in ("trace", "lower", "xla")},
            "compilation_cache_hits": int(spent["cache_hits"]),
            "compilation_cache_dir": jax.config.jax_compilation_cache_dir,
            "matmul_precision": precision()}
