"""Where an exported reference run's files go (``reference.export``): one folder per run.

    runs/<budget>/<dataset as the sweep names it>/<learner>/<cell>/seed<k>[-<setting>]

``-<setting>`` (``setting_label``) is there only where the run's setting is not the default:
``as_published=<preset>`` for a run under an ``--as_published`` preset, and ``name=value`` for
each spec override and learner option that differs from today's defaults and from the
preset's own (those that change only the rounding, ``config.COMPUTATION_OPTIONS``, never),
joined by ``-``; longer than ``LABEL_LIMIT`` characters, ``options-<SHA-256 prefix>`` stands
for the options. A run at the default setting keeps the folder it always had (every
committed folder of ``docs/reference``), so an ``--as_published`` run and a default one of
the same learner, cell and seed no longer share one.

Dataset options are not in the name (the grid's own, ``class_split=authors``, are in every
committed run): ``check_targets`` refuses, in one line, an export whose run would land in a
folder that holds another run's files (its copied config.json differs from the run's in any
field ``runs.config_differences`` compares, as ``launch.train`` refuses a workdir of another
config), or where two runs of the sweep folder would share one.
"""

from __future__ import annotations

import json
from typing import Sequence

from cfsl_jax.experiments.sweep_plan import safe_name
from cfsl_jax.runtime import checksums, files
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import as_published, runs
from cfsl_jax.training import results as results_io
from cfsl_jax.training.config import COMPUTATION_OPTIONS, TrainConfig, from_json, resolved

LABEL_LIMIT = 80


def setting_options(config: TrainConfig) -> dict:
    """The spec overrides and learner options of ``config`` that differ from today's defaults
    and from its preset's own, but those that change only the rounding."""
    preset = as_published.preset_of(config)
    own = {} if preset == "none" else {
        **as_published.PRESETS[preset].spec, **as_published.learner_options(preset,
                                                                            config.learner)}
    defaults = resolved(config.learner, {})
    learner = {k: v for k, v in config.learner_options.items() if defaults.get(k) != v}
    return {k: v for k, v in {**config.spec_overrides, **learner}.items()
            if k not in COMPUTATION_OPTIONS and own.get(k, object()) != v}


def setting_label(config: TrainConfig) -> str:
    """'' for a run at the default setting; else what its folder name adds (module doc)."""
    preset = as_published.preset_of(config)
    options = setting_options(config)
    parts = [f"as_published={preset}"] if preset != "none" else []
    words = [f"{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
             for k, v in sorted(options.items())]
    if len("-".join(words)) > LABEL_LIMIT:
        digest = checksums.sha256(json.dumps(options, sort_keys=True))[:12]
        words = [f"options-{digest}"]
    return safe_name("-".join(parts + words))


def run_folder(config: TrainConfig, budget: str) -> str:
    """``runs/<budget>/<dataset>/<learner>/<task>/seed<k>[-<setting>]`` (module doc)."""
    label = setting_label(config)
    return "/".join(["runs", safe_name(budget), safe_name(config.dataset),
                     safe_name(config.learner), safe_name(config.task),
                     f"seed{config.seed}" + (f"-{label}" if label else "")])


def check_targets(out_dir: str, workdirs: Sequence[str], folders: Sequence[str]) -> None:
    """UserError (one line) when two of ``workdirs`` (the sweep's run folders) would be
    exported into one of ``folders`` (each ``run_folder``), or one into a folder of ``out_dir``
    that holds a run with a different config."""
    seen: dict[str, str] = {}
    for workdir, folder in zip(workdirs, folders):
        if folder in seen:
            raise UserError(f"{seen[folder]} and {workdir} would both be exported to "
                            f"{files.join(out_dir, folder)} (runs that differ only in "
                            f"dataset options or in options that change only the rounding): "
                            f"export them into separate --out_dir folders")
        seen[folder] = workdir
        there = files.join(out_dir, folder, "config.json")
        if not files.exists(there):
            continue
        config = from_json(results_io.read_json(files.join(workdir, "config.json")))
        differs = runs.config_differences(results_io.read_json(there), config)
        if differs:
            raise UserError(f"{files.join(out_dir, folder)} holds a run with a different config "
                            f"(fields: {', '.join(differs)}) than {workdir}: it would be "
                            f"overwritten; export into another --out_dir, or delete that "
                            f"folder and its row to replace it")
