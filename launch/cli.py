"""The error boundary and the ``--help`` of every command (``run(main)`` replaces ``app.run``).

- A user's mistake -- ``UserError``, ``app.UsageError``, an absl flag error, a missing or
  corrupt dataset, a workdir that is a file -- prints ``error: <message>`` (one line) to
  stderr and exits with status 2: no traceback, no help dump.
- Out of device memory (XLA ``RESOURCE_EXHAUSTED``) is one line too, with what to lower.
- A stop signal (Ctrl-C, SIGTERM, SIGUSR1, SIGUSR2: ``cfsl_jax.runtime.stops``) prints one line (how to
  resume) and exits with 128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM.
- Anything else is a bug: its traceback is kept (exit status 1).
- ``--verbose`` or ``CFSL_VERBOSE=1`` adds the traceback to every error.
- ``--help`` (``-h``, ``--helpshort``) prints the command's docstring and every flag of the
  ``launch`` modules it uses, with their help and defaults, and exits 0; ``--helpfull`` adds
  absl's and jax's flags.
- ``--validate_only`` runs the command's ``check`` (flags, paths, configs: what a mistake
  would be refused for) and exits 0 without doing any work or writing anything.
- absl's log lines (``I1125 ... train.py:129] ...``) are debug detail, shown with
  ``--verbose``; the project's own lines are ``cfsl_jax.runtime.progress`` prints.
- ``write_flagfile(folder)`` writes the flags a command was given (paths made absolute) as
  ``folder/flags.txt``: ``--flagfile=folder/flags.txt`` runs the same command again.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from typing import Callable, Iterator

from absl import app, flags

from cfsl_jax.datasets.errors import CorruptDatasetError, DatasetNotFoundError
from cfsl_jax.runtime.errors import UserError

flags.DEFINE_bool("verbose", False, "Show the traceback of every error and absl's debug log "
                  "lines (also: CFSL_VERBOSE=1).")
flags.DEFINE_bool("validate_only", False, "Check the flags, paths and configuration as a run "
                  "would, print 'valid', and exit 0 without doing any work or writing anything.")

FLAGS = flags.FLAGS
USER_ERRORS = (UserError, app.UsageError, flags.Error, DatasetNotFoundError, CorruptDatasetError,
               FileExistsError, NotADirectoryError)
EXIT_USER_ERROR, EXIT_INTERRUPTED = 2, 130
FLAGFILE = "flags.txt"  # a run's flags, written into its workdir (write_flagfile)
PATH_FLAGS = ("workdir", "sweep_dir", "out_dir", "out", "data_dir", "manual_dir",
              "paper_results", "compilation_cache_dir", "compilation_cache")
_NOT_RECORDED = ("validate_only", "verbose", "retest", "dry_run")
_HELP = ("--help", "-h", "-?", "--helpshort", "--help=true", "--helpshort=true")
_HELPFULL = ("--helpfull", "--helpfull=true")


def verbose() -> bool:
    from_flag = FLAGS.is_parsed() and FLAGS["verbose"].value
    return bool(from_flag) or os.environ.get("CFSL_VERBOSE", "") not in ("", "0", "false")


def fail(message: str) -> None:
    """Print ``error: <message>`` (its first line) and exit with status 2."""
    line = " ".join(str(message).split("\n")[0].split()) or "invalid input"
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def user_message(error: BaseException) -> str:
    """The one line a user error is shown as."""
    if isinstance(error, (FileExistsError, NotADirectoryError)) and error.filename:
        return f"{error.filename} exists and is a file, not a folder: give another path"
    return str(error)


def out_of_memory_message(error: BaseException) -> str:
    from cfsl_jax.runtime.memory import OUT_OF_MEMORY_TEXTS
    first = next((line for line in str(error).splitlines() if any(
        text in line for text in OUT_OF_MEMORY_TEXTS)), str(error).splitlines()[0])
    return (f"out of device memory ({first.strip()[:200]}); lower --meta_batch, --eval_batch, "
            f"--nc, --nss or --kt, or use --compute_dtype=bfloat16")


def _listed_modules(command: str = "") -> list[str]:
    """Modules whose flags a command's --help lists: the launch package's and the script's;
    the ``command``'s module first, cli's last."""
    names = FLAGS.flags_by_module_dict()
    script = sys.argv[0] if sys.argv else ""
    ours = [m for m in names if m == script or re.search(r"(^|[./\\])launch([./\\]|$)", m)]
    return sorted(ours, key=lambda m: (m.endswith("cli") or m.endswith("cli.py"), m != command,
                                       m))


def help_text(doc: str | None, full: bool = False, command: str = "") -> str:
    lines = [(doc or "").strip(), "", "flags:"]
    if full:
        lines.append(FLAGS.get_help())
    else:
        for module in _listed_modules(command):
            text = FLAGS.module_help(module)
            lines.append(text.split("\n", 1)[1] if "\n" in text else text)
    lines.append("")
    lines.append("Errors print one line and exit with status 2; --verbose shows tracebacks.")
    return "\n".join(lines)


def _parser(doc: str | None, command: str) -> Callable[[list[str]], list[str]]:
    def parse(argv: list[str]) -> list[str]:
        args = argv[1:argv.index("--")] if "--" in argv else argv[1:]
        if any(a in _HELP or a in _HELPFULL for a in args):
            try:
                print(help_text(doc, full=any(a in _HELPFULL for a in args), command=command),
                      flush=True)
            except BrokenPipeError:  # e.g. `--help | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        check_flagfiles(args)
        try:
            rest = FLAGS(argv)
        except flags.Error as error:
            fail(user_message(error))
        if len(rest) > 1:
            fail(f"unexpected arguments {rest[1:]}: every option is a --flag=value "
                 f"(see --help)")
        return rest
    return parse


def check_flagfiles(args: list[str]) -> None:
    """Each ``--flagfile`` given can be read, or ``error: --flagfile=PATH: <why>``."""
    for i, arg in enumerate(args):
        if arg.startswith("--flagfile="):
            path = arg.partition("=")[2]
        elif arg == "--flagfile" and i + 1 < len(args):
            path = args[i + 1]
        else:
            continue
        try:
            open(path, encoding="utf-8").close()
        except OSError as error:
            fail(f"--flagfile={path}: {(error.strerror or str(error)).lower()}")


@contextlib.contextmanager
def boundary(interrupted: str = "interrupted") -> Iterator[None]:
    """Turn user errors, out-of-memory and Ctrl-C into one line and an exit status."""
    try:
        yield
    except KeyboardInterrupt as error:
        if verbose():
            traceback.print_exc()
        message = str(error) or interrupted
        print(f"\n{message}", file=sys.stderr, flush=True)
        sys.exit(getattr(error, "exit_status", EXIT_INTERRUPTED))
    except USER_ERRORS as error:
        if verbose():
            traceback.print_exc()
        fail(user_message(error))
    except Exception as error:  # noqa: BLE001  (out of memory is the user's setting; else a bug)
        from cfsl_jax.runtime.memory import is_out_of_memory  # imports jax: only once it failed
        if not is_out_of_memory(error):
            raise
        if verbose():
            traceback.print_exc()
        fail(out_of_memory_message(error))


@contextlib.contextmanager
def user_input() -> Iterator[None]:
    """Inside: a ``ValueError`` (validation of flags and configs) is the user's mistake."""
    try:
        yield
    except UserError:
        raise
    except ValueError as error:
        raise UserError(str(error)) from error


def run(main: Callable[[list[str]], None], interrupted: str = "interrupted: re-run the same "
        "command to continue where it stopped", check: Callable[[], object] | None = None,
        library: Callable[[], None] | None = None) -> None:
    """``app.run(main)`` inside the error boundary, with the teaching ``--help``; ``check``
    (the command's validation, which ``main`` runs first too) is all ``--validate_only``
    runs. ``library`` imports the command's modules (JAX) once absl has parsed its flags --
    a mistaken flag is refused before -- and before anything else (``starting.importing``)."""
    doc = sys.modules[main.__module__].__doc__

    def guarded(argv):
        from cfsl_jax.runtime import stops
        with boundary(interrupted):
            if library is not None:
                library()  # under starting's stop handlers, as a module-level import was
            stops.install()  # stop signals end the command cleanly, never lost in a callback
            quiet_logs()
            from .options import apply_backend_flags, apply_deprecated_flags
            apply_deprecated_flags()
            if FLAGS.validate_only:
                listing = "list_options" in FLAGS and FLAGS.list_options  # needs no workdir
                if check is not None and not listing:
                    check()
                print("valid: nothing was run (--validate_only)", flush=True)
                return
            apply_backend_flags()
            main(argv)

    app.run(guarded, flags_parser=_parser(doc, main.__module__))


def quiet_logs() -> None:
    """absl's INFO lines only with --verbose; never the per-call INFO chatter of libraries."""
    from absl import logging

    from .options import quiet_third_party_logs
    quiet_third_party_logs()
    if not verbose():
        logging.set_verbosity(logging.WARNING)


def flagfile_text() -> str:
    """The flags given to this command (launch modules' flags), one per line, path flags made
    absolute, as absl's ``--flagfile`` reads them."""
    from .checks import absolute
    lines = []
    for module in _listed_modules():
        for flag in FLAGS.get_flags_for_module(module):
            if not flag.present or flag.name in _NOT_RECORDED:
                continue
            if flag.name in PATH_FLAGS and isinstance(flag.value, str):
                lines.append(f"--{flag.name}={absolute(flag.value)}")
            else:
                lines.append(flag.serialize())
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def flags_recorded(folder: str) -> Iterator[None]:
    """Inside: a run in ``folder``; when it finishes or is interrupted (not when it is
    refused: a workdir of another run keeps its own flags), ``write_flagfile(folder)``."""
    try:
        yield
    except KeyboardInterrupt:
        write_flagfile(folder)
        raise
    write_flagfile(folder)


def write_flagfile(folder: str) -> None:
    """``folder/flags.txt`` (the first host only): ``--flagfile=folder/flags.txt`` re-runs the
    command that wrote it from any folder."""
    from cfsl_jax.runtime import files
    from cfsl_jax.training import results
    if results.is_primary() and files.isdir(folder):
        files.write_atomic(files.join(folder, FLAGFILE), flagfile_text())
