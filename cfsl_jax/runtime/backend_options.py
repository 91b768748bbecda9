"""The backend settings a command line chooses, and their defaults: no JAX.

    from cfsl_jax.runtime.backend_options import DEFAULT_PRECISION, PRECISIONS

``--precision`` (one of ``PRECISIONS``) and ``--compilation_cache_dir`` (default
``default_cache_dir()``); ``backend.configure`` applies them (``cfsl_jax.runtime.backend``
says what each does). Importing this module is cheap, so a command defines these flags, and
refuses a mistaken one, before JAX is imported.
"""

from __future__ import annotations

import os

PRECISIONS: tuple[str, ...] = ("default", "high", "highest")
DEFAULT_PRECISION = "default"


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/cfsl_jax/xla`` (``~/.cache/cfsl_jax/xla`` when unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "cfsl_jax", "xla")
