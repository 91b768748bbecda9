"""The one exception type for a user's mistake.

A `UserError` is a bad input the user can fix: a flag value, a spec a split cannot supply, a
missing or corrupt dataset, a wrong workdir. Its message is one line that names the value and the
limit (or the valid values). The command-line entry points print it as ``error: <message>`` and
exit with status 2, without a traceback; anything else is a bug and keeps its traceback.

It subclasses `ValueError` so that library callers catching `ValueError` keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input, explained in one line."""


class NonFiniteLoss(UserError, FloatingPointError):
    """A training loss that is NaN or infinite (the message names the step and the checkpoint
    the run resumed from); one line, as a user error: the settings or the data produce it."""
