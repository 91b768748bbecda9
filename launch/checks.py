"""Up-front checks of the paths a command is given: a mistake is one ``UserError`` line naming the
flag as typed, raised before any work and before anything is created.

    check_data_flags()                          # --manual_dir / --data_dir, where defined
    check_output_file("out", "task.png")        # its folder must exist; not a folder itself
    check_input_dir("sweep_dir", path, holding="results.json")
    absolute("data/omniglot")                   # what a run records (URLs kept as given)
"""

from __future__ import annotations

import os

from absl import flags

from cfsl_jax.runtime import files
from cfsl_jax.runtime.errors import UserError

FLAGS = flags.FLAGS


def absolute(path: str | None) -> str | None:
    """``path`` made absolute (``~`` expanded; a symlink kept as typed, not resolved to its
    target: what a run records and an error echoes is the user's path); None, '' and URLs
    (``gs://...``) as given."""
    if not path or "://" in path:
        return path
    return os.path.abspath(os.path.expanduser(path))


def check_input_dir(flag: str, path: str, holding: str | None = None) -> None:
    """``--flag=path`` (local or gs://) must be an existing folder (holding a file named
    ``holding`` somewhere below it, when given)."""
    files.check_url(flag, path)
    if not files.exists(path):
        raise UserError(f"--{flag}={path} does not exist")
    if not files.isdir(path):
        raise UserError(f"--{flag}={path} is a file, not a folder")
    if holding is not None:
        for _, _, names in files.walk(path, skip=("checkpoints", "xla_cache", "tensorboard")):
            if holding in names:
                return
        raise UserError(f"--{flag}={path} holds no {holding} (nothing finished there yet)")


def check_input_file(flag: str, path: str) -> None:
    """``--flag=path`` (local or gs://) must be an existing file."""
    files.check_url(flag, path)
    if not files.isfile(path):
        raise UserError(f"--{flag}={path} " + ("is a folder, not a file" if files.isdir(path)
                                               else "does not exist"))


def check_output_file(flag: str, path: str) -> None:
    """``--flag=path`` is a file to write (local or gs://): its folder must exist (a gs:// folder
    is created with the file), and it must not be a folder."""
    if not path:
        raise UserError(f"--{flag} is empty: give a file to write")
    files.check_url(flag, path)
    if files.isdir(path):
        raise UserError(f"--{flag}={path} is a folder: give a file name")
    if files.is_url(path):
        return
    folder = os.path.dirname(os.path.abspath(os.path.expanduser(path)))
    if not os.path.isdir(folder):
        raise UserError(f"--{flag}={path}: the folder {folder} does not exist (create it first)")


def check_output_dir(flag: str, path: str | None) -> None:
    """``--flag=path`` is a folder to write into (created when missing): it must not be a
    file, nor lie below one; a URL must be gs:// with gcsfs installed (``files.check_url``)."""
    if not path:
        return
    if files.is_url(path):
        files.check_url(flag, path)
        if files.isfile(path):
            raise UserError(f"--{flag}={path} is a file, not a folder")
        return
    probe, missing = os.path.abspath(os.path.expanduser(path)), None
    while not os.path.exists(probe):
        probe, missing = os.path.dirname(probe), probe
    if not os.path.isdir(probe):
        where = "" if probe == os.path.abspath(os.path.expanduser(path)) else f": {probe}"
        raise UserError(f"--{flag}={path}{where} is a file, not a folder")
    if missing is not None:
        check_creatable(flag, path, missing)


def check_creatable(flag: str, path: str, folder: str) -> None:
    """``folder`` (the first missing folder of ``--flag=path``) can be created: it is created
    and removed at once (permissions alone do not tell: root passes every access check, and
    /proc or a read-only mount refuse anyway)."""
    try:
        os.mkdir(folder)
        os.rmdir(folder)
    except OSError as error:
        raise UserError(f"--{flag}={path}: the folder {folder} cannot be created "
                        f"({error.strerror or error}); give a folder you can write to") from None


def check_data_flags() -> None:
    """--manual_dir must be an existing folder, --data_dir not a file, both local (or shared
    POSIX) paths (where the command defines them)."""
    for flag in ("manual_dir", "data_dir"):
        if flag in FLAGS and files.is_url(FLAGS[flag].value):
            raise UserError(f"--{flag}={FLAGS[flag].value}: the dataset folder must be a local "
                            f"or shared POSIX path (gs:// is for workdirs and sweep dirs)")
    if "manual_dir" in FLAGS and FLAGS.manual_dir:
        path = FLAGS.manual_dir
        if not os.path.exists(os.path.expanduser(path)):
            raise UserError(f"--manual_dir={path} does not exist: give the folder that holds "
                            f"the dataset's archives")
        if not os.path.isdir(os.path.expanduser(path)):
            raise UserError(f"--manual_dir={path} is a file: give the folder that holds it")
    if "data_dir" in FLAGS:
        check_output_dir("data_dir", FLAGS.data_dir)


def parse_task(text: str) -> str:
    """--task's text as a task name (upper case), refused unless it parses (a paper cell, a
    type or a type with NSS: ``TaskSpec.parse``)."""
    from cfsl_jax.protocol.spec import TaskSpec
    task = text.strip().upper()
    try:
        TaskSpec.parse(task)
    except ValueError as error:
        raise UserError(f"--task: {error}") from None
    return task
