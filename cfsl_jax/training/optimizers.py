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


# The same settings give the same optimiser object (pure functions), so a jitted step that
# closes over it is found again by a later run with the same settings (``training.steps``).
@functools.lru_cache(maxsize=64)
def optimizer(name: str, learning_rate: float, weight_decay: float | None = None,
              momentum: float | None = None) -> optax.GradientTransformation:
    """PyTorch's ``Adam`` or ``SGD(momentum=...)`` with L2 ``weight_decay`` in the gradient."""
    if name == "adam":
        base = optax.adam(learning_rate)
    elif name == "sgd":
        base = optax.sgd(learning_rate, momentum=momentum)
    else:
        raise ValueError(f"unknown optimizer {name!r}; valid: {OPTIMIZERS}")
    if weight_decay is None:
        return base
    return optax.chain(optax.add_decayed_weights(weight_decay), base)
