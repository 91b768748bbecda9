"""absl-flag entry points; run as `python -m launch.NAME` from the repo root or via the installed `cfsl-*` scripts.

A command prints its own first line, ``[NAME] starting``, before it imports JAX, and
``  still [NAME] starting (Ns: ...)`` while its modules import (``launch.starting``), with its
stop signals handled from that first instant; importing the package or any of its modules
prints nothing and starts no thread.
"""
