"""Learners: each module exports factories that build a ``Learner`` of pure functions.

    from cfsl_jax.learners import get_learner, LEARNERS
    learner = get_learner("protonets", spec, image_shape=(28, 28, 1))
"""

from __future__ import annotations

import importlib

from cfsl_jax.errors import UserError
from cfsl_jax.learners.base import Learner
from cfsl_jax.learners.precision import COMPUTE_DTYPES, with_compute_dtype
from cfsl_jax.spec import TaskSpec

# name -> (module, factory); modules are imported on first use.
_REGISTRY: dict[str, tuple[str, str]] = {
    "protonets": ("protonets", "protonets"),
    "init_tune": ("finetune", "init_tune"),
    "pretrain_tune": ("finetune", "pretrain_tune"),
    "ewc_init": ("finetune", "ewc_init"),
    "ewc_pretrain": ("finetune", "ewc_pretrain"),
    "maml_low": ("maml", "maml_low"),
    "maml_high": ("maml", "maml_high"),
    "sca": ("sca", "sca"),
}
LEARNERS: tuple[str, ...] = tuple(_REGISTRY)


def get_learner(name: str, spec: TaskSpec, compute_dtype: str = "float32",
                **options) -> Learner:
    """Build learner ``name`` for ``spec``; ``options`` go to its factory (e.g. image_shape).

    ``compute_dtype`` other than float32 wraps it with ``precision.with_compute_dtype``.
    """
    if name not in _REGISTRY:
        raise UserError(f"unknown learner {name!r}; valid: {LEARNERS}")
    module, factory = _REGISTRY[name]
    build = getattr(importlib.import_module(f"cfsl_jax.learners.{module}"), factory)
    try:
        learner = build(spec, **options)
    except TypeError as error:  # an option the factory does not take
        raise UserError(f"bad option for learner {name!r}: {error}") from error
    except ValueError as error:  # a factory refusing an option's value, in one line
        if isinstance(error, UserError):
            raise
        raise UserError(f"learner {name!r}: {error}") from error
    return with_compute_dtype(learner, compute_dtype)


__all__ = ["COMPUTE_DTYPES", "LEARNERS", "Learner", "get_learner"]
