"""Run a command's ``run()`` in the test process: its flags parsed, its checks made, its output
and exit status captured -- for what happens before a command works (``--validate_only``, and
the mistakes refused up front), without a subprocess per command.

    with command_module("report") as module:
        code, stdout, stderr = run_in_process(module, "report", ["--sweep_dir=/nope"])

A command module is imported freshly and removed afterwards with every flag it defined, since
the commands' flags overlap (``--dataset`` of train and show_task).
"""

import contextlib
import importlib
import io
import signal
import sys

from absl import flags, logging


@contextlib.contextmanager
def command_module(name: str):
    """``cfsl_jax.launch.<name>`` freshly imported; afterwards its modules and flags are gone
    (and the process's SIGINT handler and absl verbosity are as before)."""
    before_flags, before_modules = set(flags.FLAGS), set(sys.modules)
    handler, hook, verbosity = (signal.getsignal(signal.SIGINT), sys.unraisablehook,
                                logging.get_verbosity())
    try:
        yield importlib.import_module(f"cfsl_jax.launch.{name}")
    finally:
        flags.FLAGS.unparse_flags()
        for flag in set(flags.FLAGS) - before_flags:
            delattr(flags.FLAGS, flag)
        for module in set(sys.modules) - before_modules:
            if ".launch" in module:
                del sys.modules[module]
                # A parent package imported before (``from cfsl_jax.launch import cli`` in
                # another test) keeps the removed module as an attribute, and ``from . import
                # train`` would then find it there and not import (define its flags) again.
                parent, _, child = module.rpartition(".")
                if parent in sys.modules and getattr(sys.modules[parent], child, None):
                    delattr(sys.modules[parent], child)
        signal.signal(signal.SIGINT, handler)
        sys.unraisablehook = hook
        logging.set_verbosity(verbosity)


def run_in_process(module, name: str, argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``cfsl-<name> *argv``, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    flags.FLAGS.unparse_flags()
    saved_argv, sys.argv = sys.argv, [f"cfsl-{name.replace('_', '-')}", *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            module.run()
    except SystemExit as exit:
        code = 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    finally:
        sys.argv = saved_argv
    return code, out.getvalue(), err.getvalue()
