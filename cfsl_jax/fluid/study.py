"""The update-strategy study (the paper's Figures 3-c and 6): update frequency x epochs.

For one stream and one gradient-based method (fine-tuning by default, as
Figure 6; ``standard`` for Figure 3-c), every cell (U, E) of the grid runs the
method with a phase of E epochs every U samples (U counted on the paper's
90,000-sample sequences and scaled to the stream, like every schedule), and
records overall accuracy and total MACs (uncached, the paper's compute). The
paper's figure shows epochs 2, 4, 8, 16; its update frequencies are not
legible in our copy, so the default grid's U values are our choice.
Writes ``update_strategy.json`` (after each cell: a stop keeps the finished cells, and the
same command runs the rest; ``complete`` once every cell is in) and ``update_strategy.png``
into the workdir.
"""

from __future__ import annotations

import dataclasses
import json

from cfsl_jax.runtime import files, progress
from cfsl_jax.runtime import json_files
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.fluid import methods as fluid_methods
from cfsl_jax.fluid import report
from cfsl_jax.fluid.config import STUDY_EPOCHS as EPOCHS
from cfsl_jax.fluid.config import comparable
from cfsl_jax.fluid.config import STUDY_FREQUENCIES as FREQUENCIES
from cfsl_jax.fluid.experiment import (FluidConfig, check_finite, init_params, load,
                                       method_options, prepare_stream, stream_keys)
from cfsl_jax.fluid.metrics import stream_metrics
from cfsl_jax.fluid.pretraining import phase_macs, pretrain_model, prepare_params
from cfsl_jax.fluid.protocol import run_stream

FILE = "update_strategy.json"


def run_update_strategy(config: FluidConfig, workdir: str, method_name: str = "finetune",
                        frequencies=FREQUENCIES, epochs=EPOCHS) -> list[dict]:
    method = fluid_methods.get_method(method_name, config.stream.num_classes,
                                      **method_options(config, method_name))
    if method.train_step is None:
        raise UserError(f"--study_method={method_name!r} does not train; use one of "
                        f"{[m for m, s in fluid_methods.SPECS.items() if s.schedule]}")
    files.makedirs(workdir)
    done = _done_cells(workdir, config, method_name)
    grid = [(every, e) for every in frequencies for e in epochs]
    if any(cell not in done for cell in grid):
        _run_cells(config, workdir, method_name, [c for c in grid if c not in done], done)
    cells = [done[cell] for cell in grid]
    _write(workdir, config, method_name, cells, complete=True)
    report.plot_update_strategy(cells, files.join(workdir, "update_strategy.png"),
                                f"FLUID update strategies: {method_name}, "
                                f"{config.stream.length} samples")
    return cells


def _run_cells(config: FluidConfig, workdir: str, method_name: str,
               todo: list[tuple[int, int]], done: dict) -> None:
    """Run the cells ``todo`` into ``done``, writing update_strategy.json after each (a stop
    keeps every finished cell: the same command resumes with the rest)."""
    split = load(config)
    method = fluid_methods.get_method(method_name, config.stream.num_classes,
                                      tuple(split.images.shape[1:]),
                                      **method_options(config, method_name))
    stream, classes = prepare_stream(config, split, 0)
    pretrain_key, fisher_key, train_key = stream_keys(config, 0)
    params = pretrain_model(method, init_params(config, method, split), split, classes,
                            pretrain_key, steps=config.pretrain_steps,
                            batch_size=config.pretrain_batch,
                            learning_rate=config.pretrain_learning_rate)
    params = prepare_params(method, params, split, classes, fisher_key)
    phase = phase_macs(method, params, split, classes)  # EWC's Fisher at each phase
    for every, e in todo:
        schedule = dataclasses.replace(method.schedule, update_every=every,
                                       epochs_per_update=e).scaled(config.stream.length)
        record = run_stream(method, params, stream, split, train_key, schedule,
                            phase_macs=phase)
        check_finite(record, f"{method_name} at U={every} E={e}", config.streams, 0)
        metrics = stream_metrics(record.prediction, record.unseen_score, stream)
        done[every, e] = {"update_every": every, "epochs_per_update": e,
                          "scaled_update_every": schedule.update_every,
                          "accuracy": metrics["accuracy"],
                          "mean_per_class_accuracy": metrics["mean_per_class_accuracy"],
                          "gmacs": record.macs["total_uncached"] / 1e9,
                          "train_steps": record.train_steps, "seconds": record.seconds}
        _write(workdir, config, method_name, list(done.values()), complete=False)
        progress.say(f"[FLUID study] U={every} E={e}: accuracy {metrics['accuracy']:.4f}, "
                     f"{done[every, e]['gmacs']:.3g} GMACs")


def _write(workdir: str, config: FluidConfig, method_name: str, cells: list[dict],
           complete: bool) -> None:
    json_files.write_json(files.join(workdir, FILE), {
        "method": method_name, "config": config.to_json(), "cells": cells,
        "complete": complete})


def _done_cells(workdir: str, config: FluidConfig, method_name: str) -> dict:
    """{(U, E): cell} of the cells a stopped (or finished) study of ``config`` stored in
    ``workdir``; UserError when it holds a study of another config or method."""
    path = files.join(workdir, FILE)
    stored = json_files.read_json(path, default={})
    if not stored:
        return {}
    mine = comparable(json.loads(json.dumps(config.to_json())))
    if stored.get("method") != method_name or comparable(stored.get("config") or {}) != mine:
        raise UserError(f"{path} holds an update-strategy study of another method or config "
                        f"({stored.get('method')}): run its own command to finish it, or give "
                        f"a new --workdir")
    cells = {(c["update_every"], c["epochs_per_update"]): c for c in stored.get("cells", [])}
    if cells:
        progress.say(f"[FLUID study] {len(cells)} cell(s) done before, kept from {path}")
    return cells


def table(cells: list[dict]) -> str:
    epochs = sorted({c["epochs_per_update"] for c in cells})
    lines = ["U \\ E  " + "  ".join(f"{e:>16d}" for e in epochs)]
    for every in sorted({c["update_every"] for c in cells}):
        row = {c["epochs_per_update"]: c for c in cells if c["update_every"] == every}
        lines.append(f"{every:>6d} " + "  ".join(
            f"{100 * row[e]['accuracy']:6.2f}% {row[e]['gmacs']:7.3g}G" for e in epochs))
    return "\n".join(lines) + "\n(overall accuracy, total GMACs uncached; U per 90,000 samples)"


