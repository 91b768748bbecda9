"""How a config field is named in an error message: ``TrainConfig.test_tasks`` in the library,
``--test_tasks`` on the command line.

    raise UserError(f"{naming.name('TrainConfig', 'epochs')} must be a positive integer")
    with naming.field_names({"TrainConfig.epochs": "--epochs"}):
        config.check()        # "--epochs must be a positive integer, got 0"

A config's checks name a field through ``name``; a command enters ``field_names`` with its
flags (``cfsl_jax.launch.config_flags``) around building and checking the config, so a mistake
is written in the words the user typed when it is raised, never reworded afterwards.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Mapping

_NAMES: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("field_names",
                                                                          default={})


def name(owner: str, field: str, qualified: bool = True) -> str:
    """The name of ``owner.field`` in a message: the command's flag inside ``field_names``,
    else ``owner.field`` (``field`` alone where ``qualified`` is False)."""
    default = f"{owner}.{field}" if qualified else field
    return _NAMES.get().get(f"{owner}.{field}", default)


@contextlib.contextmanager
def field_names(names: Mapping[str, str]) -> Iterator[None]:
    """Inside: ``name(owner, field)`` is ``names['owner.field']`` where given."""
    token = _NAMES.set({**_NAMES.get(), **names})
    try:
        yield
    finally:
        _NAMES.reset(token)
