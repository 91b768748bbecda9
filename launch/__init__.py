"""absl-flag entry points; run as `python -m launch.NAME` from the repo root or via the installed `cfsl-*` scripts.

Run as a command (``python -m launch.NAME``, ``python -m cfsl_jax.launch.NAME`` or ``cfsl-NAME``),
the package prints ``[NAME] starting`` before the command imports JAX, so the first line comes
within a second of the start (not with ``--help``, nor with ``CFSL_PROGRESS=0``).
"""


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
    args = sys.argv[1:]
    quiet = os.environ.get("CFSL_PROGRESS", "1") in ("0", "false", "False")
    if name and not quiet and not any(a.split("=")[0] in ("--help", "-h", "-?", "--helpshort",
                                                           "--helpfull") for a in args):
        print(f"[{name}] starting", flush=True)


_announce()
