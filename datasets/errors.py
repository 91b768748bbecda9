"""Errors raised while locating or preparing a dataset.

- `DatasetNotFoundError` (a `FileNotFoundError`): the source files are not
  where they were looked for. The message names the exact file names expected
  and the folder searched.
- `CorruptDatasetError` (a `ValueError`): a source file exists but cannot be
  used (unreadable archive, failed CRC, undecodable image, missing or extra
  items). The message names the file and the reason.

Both are raised before TFDS renames its `incomplete.*` folder, so a failed
preparation never leaves anything that looks prepared. Both are also
`cfsl_jax.runtime.errors.UserError`s: the command-line tools print their one-line
message and exit with status 2.
"""

from __future__ import annotations

from cfsl_jax.runtime.errors import UserError


class DatasetNotFoundError(FileNotFoundError, UserError):
    """The raw files of a dataset are missing."""


class CorruptDatasetError(UserError):
    """The raw files of a dataset are present but corrupt or incomplete (a ValueError)."""
