"""The one optimiser factory: PyTorch's Adam and SGD as optax chains.

    opt = optimizer("adam", 1e-3, weight_decay=1e-5)      # meta-training, pretraining
    opt = optimizer("sgd", 0.1, weight_decay=1e-4, momentum=0.9)   # FLUID methods

``weight_decay`` is PyTorch's: L2 added to the gradient before the optimiser
(``optax.add_decayed_weights`` first in the chain; not AdamW's decoupled
decay). ``weight_decay=None`` leaves that element out of the chain (the
optimiser state is then the bare optimiser's).
"""

from __future__ import annotations

import functools

import optax

OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")


def optimizer(name: str, learning_rate, weight_decay=None,
              momentum: float | None = None) -> optax.GradientTransformation:
    """PyTorch's ``Adam`` or ``SGD(momentum=...)`` with L2 ``weight_decay`` in the gradient.

    ``learning_rate`` and ``weight_decay`` may be traced scalars (a pack of runs that differ in
    them: ``steps.make_steps(per_run=...)``); the optimiser state's structure does not depend
    on them, and a traced value gives the updates a Python number gives, to float32 rounding
    (XLA compiles the program around it differently)."""
    if isinstance(learning_rate, (int, float)) and isinstance(weight_decay, (int, float,
                                                                             type(None))):
        return _cached(name, learning_rate, weight_decay, momentum)
    return _build(name, learning_rate, weight_decay, momentum)


def _build(name, learning_rate, weight_decay, momentum) -> optax.GradientTransformation:
    if name == "adam":
        base = optax.adam(learning_rate)
    elif name == "sgd":
        base = optax.sgd(learning_rate, momentum=momentum)
    else:
        raise ValueError(f"unknown optimizer {name!r}; valid: {OPTIMIZERS}")
    if weight_decay is None:
        return base
    return optax.chain(optax.add_decayed_weights(weight_decay), base)


# The same settings give the same optimiser object (pure functions), so a jitted step that
# closes over it is found again by a later run with the same settings (``training.steps``).
_cached = functools.lru_cache(maxsize=64)(_build)
