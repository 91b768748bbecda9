"""One FLUID experiment: test streams x methods, pretrained per stream, mean +- std.

``run_experiment(config, workdir)`` writes into ``workdir``: ``results.json``
(config, dataset, per stream: statistics and per method metrics, MACs with and
without feature caching, training steps, seconds; and the mean +- std over the
streams), ``results.txt`` (the paper's Table 3 layout beside ours,
``report.paper_table``) and ``rolling_accuracy.png`` (first stream).

The configuration and its presets: ``fluid.config`` (``FluidConfig``, ``PRESETS``).

Keys (``seeding.purpose_key`` folded with the stream index ``i``): test stream
``i`` is built from ``fold_in(data, i)``, validation stream ``i`` from
``fold_in(data, 1000 + i)`` (disjoint from the test streams' keys), their
classes (``class_draw="disjoint"``, ``fluid.class_draw``) from one
permutation of the split's classes, ``fold_in(data, 2000)``; stream
``i``'s pretraining uses ``fold_in(pretrain, i)``, EWC's Fisher sample
``fold_in(pretrain, 10000 + i)``, method runs ``fold_in(train, i)`` -- the same
for every method.

Datasets: ``synthetic`` or any dataset of ``cfsl_jax.data`` (TFDS image sets
with a class table); on Omniglot pretrain and novel classes come from disjoint
alphabets (``alphabet_pretrain_mask``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import cfsl_jax
from cfsl_jax import data
from cfsl_jax.protocol import metrics
from cfsl_jax.runtime import files, progress, seeding
from cfsl_jax.runtime import json_files
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.fluid import methods as fluid_methods
from cfsl_jax.fluid import config as fluid_config, new_class, report, run_progress
from cfsl_jax.fluid.config import (  # noqa: F401 (re-exported: the experiment's config)
    PAPER_STREAM, PRESETS, SMALL_STREAM, STREAM_KINDS, FluidConfig, preset)
from cfsl_jax.fluid.class_draw import check_room, draw_classes
from cfsl_jax.fluid.metrics import correctness, rolling_accuracy, stream_metrics
from cfsl_jax.fluid.pretraining import phase_macs, pretrain_model, prepare_params
from cfsl_jax.fluid.protocol import Schedule, run_stream
from cfsl_jax.fluid.sequences import (Stream, StreamClasses, StreamConfig, describe,
                                      make_stream)
# stream_file, read_stream_file: also read as experiment.X (SLURM jobs, verify, tests)
from cfsl_jax.fluid.stream_files import read_stream_file, stream_file  # noqa: F401

FISHER = 10_000  # key offset of EWC's Fisher samples
CLASSES = 2000  # key offset of the class permutation every stream of a seed draws from


def stream_key(config: FluidConfig, index: int) -> jax.Array:
    """The key of stream ``index`` of ``config.streams`` (module doc)."""
    offset = 0 if config.streams == "test" else 1000
    return jax.random.fold_in(seeding.purpose_key(config.seed, "data"), offset + index)


def classes_key(config: FluidConfig) -> jax.Array:
    """The key of the seed's class permutation (``class_draw``; module doc)."""
    return jax.random.fold_in(seeding.purpose_key(config.seed, "data"), CLASSES)


def pretrain_mask(config: FluidConfig, split: data.Split) -> np.ndarray | None:
    """On Omniglot, the alphabets pretrain classes come from (``alphabet_pretrain_mask``)."""
    return (alphabet_pretrain_mask(split.info.class_names, config.stream.pretrain_fraction)
            if config.dataset.startswith("omniglot") else None)


def alphabet_pretrain_mask(class_names: tuple[str, ...], fraction: float) -> np.ndarray:
    """bool [C]: classes of the leading alphabets -- Omniglot's pretrain pool."""
    alphabets = [name.split("/")[0] for name in class_names]
    order = list(dict.fromkeys(alphabets))  # first-appearance order
    sizes = {a: alphabets.count(a) for a in order}
    chosen, total = [], 0
    for alphabet in order:
        if chosen and total + sizes[alphabet] > fraction * len(class_names):
            break
        chosen.append(alphabet)
        total += sizes[alphabet]
    return np.array([a in chosen for a in alphabets])


def load(config: FluidConfig) -> data.Split:
    """The split streams are drawn from: the synthetic set at the configured size (28-pixel
    images unless given), or a real dataset with its own options (``resize``, ``class_split``;
    the synthetic set's size options that every preset carries do not apply to it)."""
    if config.dataset == "synthetic":
        options = {"image_size": 28, **config.dataset_options}
    else:
        options = {name: value for name, value in config.dataset_options.items()
                   if name not in data.SYNTHETIC_OPTIONS}
    return data.load_split(config.dataset, config.split, data_dir=config.data_dir,
                           manual_dir=config.manual_dir, **options)


def summary_line(summary: dict) -> str:
    """``describe``'s summary of a stream in words, for the progress line."""
    samples = summary["samples"]
    return (f"{summary['length']:,} samples of {summary['classes']} classes "
            f"({summary['pretrain_classes']} pretrain, {summary['head_classes']} head; "
            f"{summary['smallest_class']} to {summary['largest_class']} samples a class); "
            f"samples pretrain-head {samples['pretrain_head']:,}, pretrain-tail "
            f"{samples['pretrain_tail']:,}, novel-head {samples['novel_head']:,}, novel-tail "
            f"{samples['novel_tail']:,}; pretraining: {summary['pretrain_samples']:,} samples, "
            f"+{summary['pretraining_only_classes']} classes outside the stream")


def schedule_for(method, config: FluidConfig) -> Schedule | None:
    """The schedule ``method`` runs: ``config.schedule``, else its own scaled to the stream."""
    if method.train_step is None:
        return None
    if config.schedule is not None:
        return config.schedule
    return method.schedule.scaled(config.stream.length)


def prepare_stream(config: FluidConfig, split: data.Split, index: int
                   ) -> tuple[Stream, StreamClasses]:
    """Stream ``index`` of ``config.streams`` from ``split`` (on Omniglot, pretrain and novel
    classes from disjoint alphabets: ``alphabet_pretrain_mask``), its summary printed; the
    stream of every experiment and study."""
    mask = pretrain_mask(config, split)
    draw = (draw_classes(classes_key(config), split.class_table.shape[0], config.stream, index,
                         config.streams == "validation", mask)
            if config.class_draw == "disjoint" else None)
    try:
        stream, classes = make_stream(stream_key(config, index), split.class_table,
                                      split.class_sizes, config.stream, pretrain_mask=mask,
                                      draw=draw)
    except ValueError as error:  # a stream the split cannot give: the user's setting
        raise UserError(f"{config.streams} stream {index} of the {config.split} split: "
                        f"{error}") from None
    progress.say(f"[FLUID] {config.streams} stream {index}: "
                 f"{summary_line(describe(stream, classes))}")
    return stream, classes


def stream_keys(config: FluidConfig, index: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(pretraining, EWC's Fisher sample, method runs) keys of stream ``index`` (module doc)."""
    pretrain = seeding.purpose_key(config.seed, "pretrain")
    return (jax.random.fold_in(pretrain, index), jax.random.fold_in(pretrain, FISHER + index),
            jax.random.fold_in(seeding.purpose_key(config.seed, "train"), index))


def init_params(config: FluidConfig, method, split: data.Split):
    """The initial backbone of every method of ``config`` (the same Conv-4 for all)."""
    return method.init_params(seeding.purpose_key(config.seed, "init"),
                              jnp.zeros((1, *split.images.shape[1:]), jnp.float32))


def run_methods(config: FluidConfig, split: data.Split, built: dict, index: int):
    """Stream ``index`` of ``config.streams``: ``(stream, classes, {name: (record, schedule,
    pretrain seconds)})``, every method pretrained for the stream and run on it."""
    stream, classes = prepare_stream(config, split, index)
    init = init_params(config, next(iter(built.values())), split)
    pretrain_key, fisher_key, train_key = stream_keys(config, index)
    pretrained, known, runs = {}, {}, {}
    for name, method in built.items():
        started = time.perf_counter()
        run_progress.started(config.streams, index, name)
        if method.pretraining not in pretrained:  # one pretraining per strategy and stream
            pretrained[method.pretraining] = pretrain_model(
                method, init, split, classes, pretrain_key,
                steps=config.pretrain_steps, batch_size=config.pretrain_batch,
                learning_rate=config.pretrain_learning_rate)
        # Every method of a run embeds with the same Conv-4 (config.filters): the pretraining
        # images' class statistics are computed once per pretrained backbone.
        params = prepare_params(method, pretrained[method.pretraining], split, classes,
                                fisher_key, known=known.get(method.pretraining))
        if "known" in params:
            known[method.pretraining] = params["known"]
        pretrain_seconds = time.perf_counter() - started
        schedule = schedule_for(method, config)
        record = run_stream(method, params, stream, split, train_key, schedule,
                            phase_macs=phase_macs(method, params, split, classes))
        check_finite(record, name, config.streams, index)
        runs[name] = (record, schedule, pretrain_seconds)
        run_progress.finished(config.streams, index, name, time.perf_counter() - started)
    return stream, classes, runs


def check_finite(record, name: str, kind: str, index: int) -> None:
    """UserError when a method's unseen-class scores hold NaN or its final state is not finite
    (its training diverged; argmax over NaN logits still predicts class 0): a number that cannot
    be trusted is refused, in one line, before anything of the stream is stored."""
    bad = int(np.isnan(record.unseen_score).sum())
    if bad or not record.finite:
        what = (f"{bad} of its {record.unseen_score.size} unseen-class scores are NaN" if bad
                else "its weights at the stream's end are not finite")
        raise UserError(f"{name} on {kind} stream {index}: {what} (its training diverged: "
                        f"check its --method_option values, e.g. a lower learning_rate); "
                        f"nothing of this stream is stored")


def run_one_stream(config: FluidConfig, split: data.Split, built: dict, index: int,
                   thresholds: dict[str, float] | None = None) -> tuple[dict, dict, dict]:
    """Stream ``index``: (stream statistics, per method results, rolling-accuracy curves);
    ``thresholds``: the "new class" threshold of each method counted K+1-way."""
    stream, classes, runs = run_methods(config, split, built, index)
    per_method, curves = {}, {}
    for name, (record, schedule, pretrain_seconds) in runs.items():
        threshold = (thresholds or {}).get(name)
        result = stream_metrics(record.prediction, record.unseen_score, stream, config.window,
                                new_class_threshold=threshold)
        curves[name] = rolling_accuracy(
            correctness(record.prediction, record.unseen_score, stream, threshold)[0],
            result["rolling_window"])
        per_method[name] = {"detector": built[name].detector, "metrics": result,
                            "macs": record.macs,
                            "schedule": schedule.describe() if schedule else None,
                            "train_steps": record.train_steps, "seconds": record.seconds,
                            "pretrain_seconds": pretrain_seconds}
        progress.say(f"[FLUID] {name}: accuracy {result['accuracy']:.4f} auroc "
                     f"{report.auroc_text(result['auroc'])} ({record.seconds:.1f} s; "
                     f"{'schedule ' + schedule.describe() if schedule else 'no training'})")
    return describe(stream, classes), per_method, curves


def new_class_thresholds(config: FluidConfig, workdir: str, split: data.Split, built: dict
                         ) -> dict[str, dict]:
    """Per method with the ``new_class`` option: its threshold, chosen on the validation
    streams ``0 .. validation_streams-1`` (``new_class.thresholds``)."""
    validation = dataclasses.replace(config, streams="validation")
    chosen_here = [n for n in built if method_options(config, n).get("new_class")
                   and method_options(config, n).get("new_class_threshold") is None]
    if chosen_here and config.class_draw == "disjoint":  # test and validation streams apart
        check_room(classes_key(config), split.class_table.shape[0], config.stream,
                   config.num_streams, config.validation_streams, pretrain_mask(config, split))

    def run(names, index):  # validation stream ``index``: (stream, {name: StreamRecord})
        stream, _, runs = run_methods(validation, split, {n: built[n] for n in names}, index)
        return stream, {name: run[0] for name, run in runs.items()}

    return new_class.thresholds({n: method_options(config, n) for n in built},
                                files.join(workdir, "new_class.json"), config.to_json(),
                                config.validation_streams, run)


def summarise(per_stream: list[dict]) -> dict[str, dict]:
    """Per method: mean, sample std and Student-t 95% half-width over streams of each number
    (``metrics.across_runs``)."""
    summary = {}
    for name in per_stream[0]:
        runs = [stream[name] for stream in per_stream]
        keys = list(report.METRIC_KEYS) + ["macs.total", "macs.total_uncached", "seconds"]
        entry = {"detector": runs[0]["detector"], "schedule": runs[0]["schedule"],
                 "streams": len(runs)}
        for key in keys:
            values = [report.lookup(run, key) for run in runs]
            if any(v is None for v in values):
                entry[key] = {"mean": None, "std": None, "ci95": None}
                continue
            spread = metrics.across_runs(values)
            entry[key] = {"mean": spread.mean, "std": spread.std, "ci95": spread.ci95}
        summary[name] = entry
    return summary


def _stored_run(config: FluidConfig, path: str) -> dict:
    """What an earlier run of the same config left in ``path`` (``{}`` if nothing)."""
    if not files.exists(path):
        return {}
    stored = json_files.read_json(path)
    ours = json.loads(json.dumps(config.to_json()))  # tuples as JSON stores them
    theirs = fluid_config.comparable(stored.get("config", {}))
    done = len(stored.get("streams", []))
    if {**theirs, "num_streams": 0} != {**ours, "num_streams": 0}:
        raise UserError(f"{path} holds a run with a different configuration: use a new "
                        f"--workdir (or delete it) to run this one")
    if done > config.num_streams:
        raise UserError(f"num_streams={config.num_streams} but {path} already holds {done} "
                        f"streams: ask for at least {done}, or use a new --workdir")
    return stored


def run_experiment(config: FluidConfig, workdir: str) -> dict[str, Any]:
    """Run every method of ``config`` on ``num_streams`` streams; write and return the results.

    ``results.json`` is rewritten after each stream (``"complete": false`` until
    the last): the same config run into the same ``workdir`` again resumes after
    the last finished stream (stream ``i`` depends only on the seed and ``i``, so
    a larger ``num_streams`` extends a finished run); a complete run only
    rewrites ``results.txt``. A stream that ``run_stream_alone`` stored (a SLURM
    job per stream) is read, not run again.
    """
    files.makedirs(workdir)
    path = files.join(workdir, "results.json")
    stored = _stored_run(config, path)
    streams = list(stored.get("streams", []))
    if len(streams) == config.num_streams:
        progress.say(f"[FLUID] {path}: every stream already done (a new --workdir runs it again)")
        _write_table(stored, config, workdir)
        return stored
    if streams:
        progress.say(f"[FLUID] {path}: {len(streams)} of {config.num_streams} streams already "
                     f"done; resuming")
    started = time.perf_counter()
    previous = stored.get("wall_seconds", 0.0)
    with run_progress.tracking(config.streams, len(streams), config.num_streams, config.methods,
                               path):
        return _run_streams(config, workdir, path, streams, started, previous,
                            stored.get("new_class") if streams else None)


def _run_streams(config: FluidConfig, workdir: str, path: str, streams: list, started: float,
                 previous: float, counted: dict | None) -> dict[str, Any]:
    """The streams not stored yet, ``results.json`` rewritten after each; every stream counted
    with the 'new class' thresholds of those before it (``counted``: None for the first)."""
    built: dict = {}
    for index in range(len(streams), config.num_streams):
        done = read_stream_file(config, workdir, index)  # written by a job of its own (SLURM)
        source = stream_file(workdir, index)
        if done is None:
            if not built:
                split = load(config)
                built = {"split": split, "methods": build_methods(config, split)}
            done = compute_stream(config, workdir, built["split"], built["methods"], index)
            source = f"stream {index} (run here)"
        used = done.get("new_class", {})
        new_class.check_agree(counted, used, source, files.join(workdir, "new_class.json"))
        counted = used
        streams.append({"stream": done["stream"], "methods": done["methods"]})
        results = {
            "config": config.to_json(),
            "dataset": done["dataset"],
            "streams": streams,
            "complete": len(streams) == config.num_streams,
            "summary": summarise([s["methods"] for s in streams]),
            "new_class": done.get("new_class", {}),
            "wall_seconds": previous + time.perf_counter() - started,
            "versions": {"cfsl_jax": cfsl_jax.__version__, "jax": jax.__version__,
                         "backend": jax.default_backend()},
        }
        json_files.write_json(path, results)
        _write_table(results, config, workdir)
    return results


def build_methods(config: FluidConfig, split: data.Split) -> dict:
    """Every method of ``config``, built for the split's images (schedules logged)."""
    image_shape = tuple(split.images.shape[1:])
    k = config.stream.num_classes
    built = {name: fluid_methods.get_method(name, k, image_shape,
                                            **method_options(config, name))
             for name in config.methods}
    for name, method in built.items():
        schedule = schedule_for(method, config)
        if schedule is not None and config.schedule is None:
            progress.say(f"[FLUID] {name}: the paper's schedule ({method.schedule.describe()}) "
                         f"scaled to {config.stream.length} samples: {schedule.describe()}")
    return built


def compute_stream(config: FluidConfig, workdir: str, split: data.Split, built: dict,
                   index: int) -> dict:
    """Run stream ``index``; the first stream also plots ``rolling_accuracy.png``."""
    thresholds = new_class_thresholds(config, workdir, split, built)
    stats, per_method, curves = run_one_stream(config, split, built, index,
                                               {n: t["threshold"] for n, t in thresholds.items()})
    if index == 0:
        window = next(iter(per_method.values()))["metrics"]["rolling_window"]
        report.plot_rolling_accuracy(curves, window,
                                     files.join(workdir, "rolling_accuracy.png"),
                                     title=f"FLUID on {split.info.dataset}: rolling accuracy")
    dataset = {"name": split.info.dataset, "split": split.info.split,
               "num_classes": split.info.num_classes, "num_images": split.info.num_images,
               "source": split.info.source}
    return {"config": config.to_json(), "dataset": dataset, "stream": stats,
            "methods": per_method, "new_class": thresholds}


def run_stream_alone(config: FluidConfig, workdir: str, index: int) -> None:
    """Stream ``index`` in a process of its own (a SLURM array job): writes
    ``stream_file(workdir, index)``, which ``run_experiment`` then reads instead of running
    the stream. Nothing is run when the stream is stored already."""
    path = files.join(workdir, "results.json")
    done = files.exists(path) and len(_stored_run(config, path).get("streams", [])) > index
    if done or read_stream_file(config, workdir, index) is not None:
        return
    files.makedirs(workdir)
    split = load(config)
    json_files.write_json(stream_file(workdir, index),
                          compute_stream(config, workdir, split, build_methods(config, split),
                                         index), sealed=True)


def _write_table(results: dict, config: FluidConfig, workdir: str) -> None:
    text = report.paper_table(results["summary"], dataset=results["dataset"]["name"],
                              streams=f"{len(results['streams'])} {config.streams} stream(s)",
                              new_class=results.get("new_class"))
    files.write_atomic(files.join(workdir, "results.txt"), text + "\n")


def method_options(config: FluidConfig, name: str) -> dict:
    """Method ``name``'s options: ``config.filters``, then its ``method_options``."""
    return {"filters": config.filters, **config.method_options.get(name, {})}
