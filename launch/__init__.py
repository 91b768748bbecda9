"""absl-flag entry points; run as `python -m launch.NAME` from the repo root or via the installed `cfsl-*` scripts."""
