"""Refuse a compiled program that cannot fit in device memory, before it runs.

    compiled = jax.jit(step).lower(*args).compile()
    memory.check_fits(compiled, "the meta-training step", "lower --meta_batch (now 8)")

XLA's ``memory_analysis()`` of a compiled program gives, per device, the bytes
of its arguments, outputs and temporaries. On an accelerator the whole program
must fit in the device's ``bytes_limit``; on CPU the arguments already live in
RAM, so its temporaries and outputs must fit in the RAM still available
(``MemAvailable`` of ``/proc/meminfo``). Where neither is known nothing is
checked. A program that passes and still runs out (XLA ``RESOURCE_EXHAUSTED``)
is turned into one line by the command lines' error boundary.
"""

from __future__ import annotations

import jax

from cfsl_jax.runtime.errors import UserError

GIB = 2**30
# jax's runtime error class (``XlaRuntimeError`` is its older name, where still exported).
RUNTIME_ERRORS: tuple[type[BaseException], ...] = tuple(
    cls for cls in (getattr(jax.errors, "JaxRuntimeError", None),
                    getattr(jax.errors, "XlaRuntimeError", None)) if cls is not None)
OUT_OF_MEMORY_TEXTS = ("RESOURCE_EXHAUSTED", "Out of memory")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is jax's runtime error for an allocation that did not fit."""
    return isinstance(error, RUNTIME_ERRORS) and any(
        text in str(error) for text in OUT_OF_MEMORY_TEXTS)


def available_ram() -> int | None:
    """Bytes of RAM the kernel says are available now (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def device_limit(device: jax.Device) -> tuple[int | None, bool]:
    """(bytes a program may use on ``device``, whether its arguments count against them)."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001  (not every backend implements memory_stats)
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), True
    if device.platform == "cpu":
        return available_ram(), False
    return None, True


def needed_bytes(compiled, with_arguments: bool) -> int | None:
    """XLA's estimate of the bytes ``compiled`` needs per device (None when it gives none)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        return None
    if stats is None:
        return None
    need = stats.temp_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
    return need + (stats.argument_size_in_bytes if with_arguments else 0)


def check_fits(compiled, what: str, hint: str, device: jax.Device | None = None) -> None:
    """Raise UserError (with the figures and ``hint``) when ``compiled`` cannot fit."""
    device = device or jax.local_devices()[0]
    limit, with_arguments = device_limit(device)
    need = needed_bytes(compiled, with_arguments)
    if limit is None or need is None or need <= limit:
        return
    where = ("of RAM available" if device.platform == "cpu" and not with_arguments
             else f"on {device.device_kind}")
    raise UserError(f"{what} needs {need / GIB:.1f} GiB per device (XLA's estimate), more than "
                    f"the {limit / GIB:.1f} GiB {where}; {hint}")
