"""The plain training loop: steps with progress lines, and no epochs, validation or checkpoints.

    state = plain_loop.run_steps("pretraining", "steps", 1000, state, step, key, log_every=100)

For short or restartable work that ``loop.run``'s lifecycle would only slow down (the
fine-tuners' pretraining on uniformly drawn images, FLUID's meta-training): step ``s`` draws
its randomness from ``fold_in(key, s)``, as in ``loop.run``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np
from absl import logging

from cfsl_jax.runtime import progress


def run_steps(what: str, unit: str, steps: int, state: Any,
              step: Callable[[Any, jax.Array], tuple[Any, dict[str, jax.Array]]],
              key: jax.Array, log_every: int | None = None) -> Any:
    """The plain loop (no epochs, validation or checkpoints): ``state, metrics = step(state,
    fold_in(key, s))`` for ``s < steps``, with progress lines (the device's metrics are read
    only for a line) and, every ``log_every`` steps, an absl line of the metrics' mean since the
    last one (one host read each)."""
    window: list[dict[str, jax.Array]] = []
    started = time.perf_counter()
    bar = progress.tracker(what, steps, unit)
    for s in range(steps):
        state, out = step(state, jax.random.fold_in(key, s))
        if bar.due() or s + 1 == steps:
            bar.update(s + 1, **{name: float(value) for name, value in out.items()})
        if log_every:
            window.append(out)
            if (s + 1) % log_every == 0 or s + 1 == steps:
                means = {name: float(np.mean([v[name] for v in jax.device_get(window)]))
                         for name in out}
                logging.info("%s step %d/%d: %s (%.1f steps/s)", what, s + 1, steps,
                             " ".join(f"{name} {value:.4f}" for name, value in means.items()),
                             (s + 1) / (time.perf_counter() - started))
                window.clear()
    return state

