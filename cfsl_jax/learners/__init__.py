"""Learners: each module exports factories that build a ``Learner`` of pure functions.

    from cfsl_jax.learners import get_learner, LEARNERS
    learner = get_learner("protonets", spec, image_shape=(28, 28, 1), filters=32)

or, typed: ``protonets.protonets(spec, ProtoNetsOptions(filters=32), image_shape=...)``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from cfsl_jax.runtime import options as opt

from cfsl_jax.runtime.errors import UserError
from cfsl_jax.protocol.spec import TaskSpec

if TYPE_CHECKING:
    from cfsl_jax.protocol.learner import Learner

# Imported on first use (``__getattr__``), as the learners' modules: the names and options above
# need no JAX, so a command line checks its flags before JAX is imported.
_LAZY = {"COMPUTE_DTYPES": "cfsl_jax.learners.precision", "Learner": "cfsl_jax.protocol.learner"}

# name -> (module, factory, options class); modules are imported on first use.
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "protonets": ("protonets", "protonets", "ProtoNetsOptions"),
    "init_tune": ("finetune", "init_tune", "FinetuneOptions"),
    "pretrain_tune": ("finetune", "pretrain_tune", "FinetuneOptions"),
    "ewc_init": ("finetune", "ewc_init", "EwcOptions"),
    "ewc_pretrain": ("finetune", "ewc_pretrain", "EwcOptions"),
    "maml_low": ("maml", "maml_low", "MamlLowOptions"),
    "maml_high": ("maml", "maml_high", "MamlHighOptions"),
    "sca": ("sca", "sca", "ScaOptions"),
}
LEARNERS: tuple[str, ...] = tuple(_REGISTRY)
# The dtypes a learner computes in (``precision.COMPUTE_DTYPES`` maps each to JAX's).
COMPUTE_DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# A factory keyword that is not an option: ProtoNets' carried-state dtype.
_NOT_OPTIONS = ("state_dtype",)


def _check_name(name: str) -> None:
    if name not in _REGISTRY:
        raise UserError(f"unknown learner {name!r}; valid: {LEARNERS}")


def options_class(name: str) -> type:
    """The frozen dataclass of learner ``name``'s options (defaults, types, limits, help)."""
    _check_name(name)
    module, _, options = _REGISTRY[name]
    return getattr(importlib.import_module(f"cfsl_jax.learners.{module}"), options)


def learner_options(name: str, options: Mapping[str, Any]) -> Any:
    """``options`` of learner ``name`` as its options dataclass, checked (UserError)."""
    return opt.build(options_class(name), options, f"learner {name!r}")


def parse_learner_options(name: str, pairs: Iterable[str],
                          owner: str | None = None) -> dict[str, Any]:
    """``NAME=VALUE`` strings -> {name: value typed as learner ``name``'s option}, checked;
    a UserError starts with ``owner`` (default: "learner NAME")."""
    return opt.parse(options_class(name), pairs, owner or f"learner {name!r}")


def get_learner(name: str, spec: TaskSpec, compute_dtype: str = "float32",
                image_shape: tuple[int, int, int] = (28, 28, 1), **options) -> Learner:
    """Build learner ``name`` for ``spec`` and inputs of ``image_shape``; ``options`` are its
    options by name (checked into ``options_class(name)``, UserError) and, for ProtoNets,
    the factory's ``state_dtype``.

    ``compute_dtype`` other than float32 wraps it with ``precision.with_compute_dtype``.
    """
    _check_name(name)
    extra = {key: options.pop(key) for key in _NOT_OPTIONS if key in options}
    typed = learner_options(name, options)
    settings = (name, spec, compute_dtype, tuple(image_shape), typed, tuple(sorted(extra.items())))
    try:
        hash(settings)
    except TypeError:  # an unhashable setting: built afresh
        return _build(*settings)
    kinds = tuple(type(getattr(typed, field.name)) for field in dataclasses.fields(typed))
    return _built(*settings, kinds)


def _build(name: str, spec: TaskSpec, compute_dtype: str, image_shape: tuple[int, int, int],
           typed: Any, extra: tuple[tuple[str, Any], ...]) -> Learner:
    module, factory, _ = _REGISTRY[name]
    build = getattr(importlib.import_module(f"cfsl_jax.learners.{module}"), factory)
    learner = build(spec, typed, image_shape=image_shape, **dict(extra))
    from cfsl_jax.learners.precision import with_compute_dtype
    return with_compute_dtype(learner, compute_dtype)


# The same settings give the same Learner object, so the programs jitted with the learner as a
# static argument (evaluation, training steps) compile once per process for all the runs that
# share its settings (a sweep's seeds, a resumed or repeated run), as module-level jitted steps
# do in flax/big_vision. A learner is pure functions: sharing one changes no number.
@functools.lru_cache(maxsize=64)
def _built(name: str, spec: TaskSpec, compute_dtype: str, image_shape: tuple[int, int, int],
           typed: Any, extra: tuple[tuple[str, Any], ...], kinds: tuple[type, ...]) -> Learner:
    # ``kinds`` (the options' types) is in the key only: True == 1 with equal hashes, yet
    # unroll=True (every support set) is not unroll=1; without it the MACs of a meta-step,
    # counted with unroll=True, were the training learner's (unroll=1: one support set)
    del kinds
    return _build(name, spec, compute_dtype, image_shape, typed, extra)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMPUTE_DTYPE_NAMES", "COMPUTE_DTYPES", "LEARNERS", "Learner", "get_learner", "learner_options",
           "options_class", "parse_learner_options"]
