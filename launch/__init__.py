"""absl-flag entry points; run as `python -m launch.NAME` from the repo root or via the installed `cfsl-*` scripts.

Run as a command (``python -m launch.NAME``, ``python -m cfsl_jax.launch.NAME`` or ``cfsl-NAME``),
the package prints ``[NAME] starting`` before the command imports JAX, so the first line comes
within a second of the start (not with ``--help``, nor with ``CFSL_PROGRESS=0``); until the
command's work begins (``STARTED``, set by ``cli.run``), ``  still [NAME] starting (Ns: ...)``
follows every ``STARTING_HEARTBEAT_S`` seconds (importing JAX takes seconds, more on a
loaded machine).

A command's stop signals (SIGINT, SIGTERM, SIGUSR1, SIGUSR2) are handled from the package's
first line, before JAX is imported: until ``cli.run`` installs the real handlers
(``cfsl_jax.runtime.stops``), a stop prints one line (nothing was run or written) and exits
with 128 + the signal's number at once.
"""


def _stop_while_starting(signum, frame):  # the first code of a command: keep it light
    import os
    import signal
    name = signal.Signals(signum).name
    os.write(2, f"\ninterrupted by {name} while starting: nothing was run or written; run the "
                f"same command again\n".encode())
    os._exit(128 + signum)


_stop_while_starting.stops_early = True  # stops.install replaces it


def _install_early_stops() -> None:
    import signal
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(signum, _stop_while_starting)


import threading as _threading  # noqa: E402

STARTED = _threading.Event()  # set by cli.run once the flags are parsed and the work begins
STARTING_HEARTBEAT_S = 9.5  # under the 10 s between two progress lines


def heartbeat_until(name: str, started: _threading.Event,
                    period: float = STARTING_HEARTBEAT_S) -> None:
    """Print ``  still [name] starting (...)`` every ``period`` s until ``started`` is set."""
    import time
    began = time.monotonic()

    def beat():
        while not started.wait(period):
            print(f"  still [{name}] starting ({time.monotonic() - began:.1f}s: importing JAX "
                  f"and the command's modules)", flush=True)

    _threading.Thread(target=beat, daemon=True).start()


def _command_name() -> str | None:
    """``train`` when this process runs a launch command, else None (an import)."""
    import os
    import sys
    argv = list(getattr(sys, "orig_argv", []))  # as the process was started (not a spawned
    if "-m" in argv[:-1]:                        # worker's copy of its parent's sys.argv)
        module = argv[argv.index("-m") + 1]
        package, _, name = module.rpartition(".")
        return name if package.endswith("launch") and name else None
    script = os.path.basename(argv[1]) if len(argv) > 1 else ""
    return script[len("cfsl-"):].replace("-", "_") if script.startswith("cfsl-") else None


def _announce() -> None:
    import os
    import sys
    name = _command_name()
    if name and _threading.current_thread() is _threading.main_thread():
        _install_early_stops()
    args = sys.argv[1:]
    quiet = os.environ.get("CFSL_PROGRESS", "1") in ("0", "false", "False")
    if name and not quiet and not any(a.split("=")[0] in ("--help", "-h", "-?", "--helpshort",
                                                           "--helpfull") for a in args):
        print(f"[{name}] starting", flush=True)
        heartbeat_until(name, STARTED)


_announce()
