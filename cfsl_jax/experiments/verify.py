"""Check that a run's evaluation tasks (and test metrics) can be reproduced: MATCH or what differs."""

from __future__ import annotations

import dataclasses
import functools
import os

import jax

from cfsl_jax.runtime import checksums, files, progress
from cfsl_jax.training import checkpoints, pack_eval, results, tracking
from cfsl_jax.training import runs
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training.evaluate import data_digest, dataset_identity, task_fingerprint

CHECKED_METRICS = ("acc_mean", "acc_std", "acc_ci95", "ce_mean", "ce_std", "ce_ci95")
CHECKED_LISTS = ("group_acc", "per_task")  # each class group's accuracy; each task's acc and CE
COST_METRICS = ("atm", "macs_adapt", "macs_predict", "macs_per_task", "macs_per_meta_step")


def load(workdir: str, **paths: str | None) -> tuple[TrainConfig, dict]:
    """(config, recorded results) of a finished run; ``paths`` (``data_dir``, ``manual_dir``)
    given replace the recorded ones (a run recorded before paths were made absolute, verified
    from another folder); a recorded relative folder that does not exist from here, and is not
    replaced, is a UserError naming the flag that replaces it (nothing is prepared there)."""
    config = runs.load_config(workdir)
    path = files.join(workdir, "results.json")
    if not files.isfile(path):
        raise UserError(f"--workdir={workdir} holds no finished run (no results.json): finish "
                        f"it first (re-run its launch.train command)")
    given = {name: files.absolute(value) for name, value in paths.items() if value}
    for name in ("manual_dir", "data_dir"):
        recorded = getattr(config, name)
        if (name not in given and recorded and not files.is_url(recorded)
                and not os.path.isabs(recorded) and not os.path.exists(recorded)):
            raise UserError(f"{files.join(workdir, 'config.json')} records {name}={recorded!r}, "
                            f"relative to the folder the run started in, and "
                            f"{os.path.abspath(recorded)} does not exist: run launch.verify "
                            f"in that folder, or give --{name}=FOLDER")
    return dataclasses.replace(config, **given), results.read_json(path)


def check_files(workdir: str) -> list[str]:
    """Check the SHA-256 of every checked file of ``workdir`` (its JSON files, the sealed part
    of its metrics.jsonl and each checkpoint's files), saying which were checked;
    ``checksums.Corrupt`` (one line naming the file) at the first that fails. Returns the names
    checked (not the files of a workdir written before checksums: said once)."""
    if not checksums.has_manifest(workdir):
        checksums.legacy(workdir)
    checked = []
    for name in checksums.CHECKED:
        path = files.join(workdir, name)
        if files.isfile(path) and name in checksums.recorded(workdir):
            checksums.read_checked(path)
            checked.append(name)
    metrics = files.join(workdir, tracking.METRICS_FILE)  # its part sealed at a checkpoint
    if files.isfile(metrics) and tracking.METRICS_FILE in checksums.recorded(workdir):
        tracking.read(metrics)
        checked.append(tracking.METRICS_FILE)
    if files.isdir(files.join(workdir, "checkpoints")):
        ckpt = checkpoints.Checkpoints(workdir, read_only=True)
        try:
            checked += [folder[len(files.absolute(workdir)):].lstrip("/")
                        for folder in ckpt.check_all()]
        finally:
            ckpt.close()
    if checked:
        progress.say(f"[verify] checksums of {len(checked)} files and checkpoints match: "
                     f"{', '.join(checked)}")
    return checked


def trained_differences(config: TrainConfig, learner, workdir: str,
                        recorded: dict) -> list[str]:
    """How the run's checkpoints fall short of a finished run's (``runs.check_trained``: a
    results.json beside a run stopped part-way, or missing a best epoch, is not that run), and
    whether its best epochs are the ones its test ensembled."""
    if not files.isdir(files.join(workdir, "checkpoints")):
        return [f"training: no checkpoints in {workdir}"]
    ckpt = checkpoints.Checkpoints(workdir, config.keep_best, read_only=True)
    try:
        runs.check_trained(config, learner, workdir, ckpt)
        kept = ckpt.best_epochs()
    except UserError as error:
        return [f"training: {error}"]
    finally:
        ckpt.close()
    if recorded.get("best_epochs") and recorded["best_epochs"] != kept:
        return [f"best_epochs: recorded {recorded['best_epochs']}, now {kept}"]
    return []


def verify(workdir: str, metrics: bool = True, data_dir: str | None = None,
           manual_dir: str | None = None, costs: bool = True) -> list[str]:
    """Differences between ``workdir/results.json`` and a recomputation (empty list: MATCH).

    Checks every checksum first (``check_files``). Recomputes the test tasks' fingerprint
    from (split, spec, seed), the test data's digest (``evaluate.data_digest``, where
    results.json records it: ``test_data_sha256``) and, when
    ``metrics`` and the run has finished, the test metrics from its
    checkpoints (equal bit for bit on the same backend: the summaries, each class group's
    accuracy and each task's accuracy and CE; a run its pack tested is re-tested as
    its pack's program where its lone re-test rounds differently); with ``costs``, ATM and
    the MACs (``cost_differences``). ``data_dir`` / ``manual_dir`` replace the recorded
    folders where given.
    """
    check_files(workdir)
    config, recorded = load(workdir, data_dir=data_dir, manual_dir=manual_dir)
    learner, splits = runs.build(config)
    differences = []
    trains = runs.selects_epochs(config, learner) or learner.recipe.training == "pretrain"
    if trains and (metrics or files.isdir(files.join(workdir, "checkpoints"))):
        # (--nometrics on a folder of results alone, e.g. docs/reference: nothing to check)
        differences += trained_differences(config, learner, workdir, recorded)
    sizes = results.split_sizes(splits)
    if sizes != recorded["splits"]:
        differences.append(f"split sizes: recorded {recorded['splits']}, now {sizes}")
    with progress.stage(f"[verify] sampling the {config.test_tasks} test tasks"):
        fingerprint = task_fingerprint(splits["test"], learner.spec, config.test_tasks,
                                       config.task_seed)
    if fingerprint != recorded["task_fingerprint"]:
        differences.append(f"task_fingerprint: recorded {recorded['task_fingerprint']}, "
                           f"now {fingerprint}")
    stored = results.test_record(recorded)
    if stored.dataset_identity is not None and \
            stored.dataset_identity != dataset_identity(splits["test"]):
        differences.append(f"dataset: recorded {stored.dataset_identity!r}, "
                           f"now {dataset_identity(splits['test'])!r}")
    if recorded.get("test_data_sha256") is not None:  # (a record from before it: as before)
        now = data_digest(splits["test"])
        if now != recorded["test_data_sha256"]:
            differences.append(f"test data: recorded SHA-256 {recorded['test_data_sha256'][:12]}, "
                               f"now {now[:12]} (other class names, class order or images, "
                               f"with the same counts: the fingerprint cannot tell)")
    counted = cost_differences(config, learner, splits, recorded) if costs else []
    if metrics and not differences:
        params = runs.restore_params(config, learner, splits, workdir, ensemble=True)
        from cfsl_jax.training.evaluate import evaluate
        retest = functools.partial(evaluate, learner, split=splits["test"],
                                   num_tasks=config.test_tasks, seed=config.task_seed,
                                   batch_size=config.eval_batch, cost_metrics=False,
                                   per_task=stored.per_task is not None,
                                   ensemble=runs.selects_epochs(config, learner),
                                   tasks_in_turn=tested_in_turn(stored, recorded),
                                   mesh=tested_mesh(stored))
        report = retest(params)
        relative = _relative_differences(report, stored)
        if relative and stored.pack_runs:  # tested by its pack (results.json's test_in_pack)
            # its pack's program, K runs under lax.map, each computing only from its own params:
            # K copies of this run's params give this run's numbers as its pack gave them
            alone = max(relative.values())
            report = retest(pack_eval.stack([params] * stored.pack_runs), runs=True)[0]
            relative = _relative_differences(report, stored)
            if not relative:
                progress.say(f"[verify] the lone re-test differs by {alone:.1e} relative, the "
                             f"rounding of another program; re-tested as its pack's test "
                             f"program ({stored.pack_runs} runs in one), it is bit-equal")
        differences += [_difference(name, stored, report) for name in relative]
        if relative and recorded.get("test_in_pack"):
            differences.append(
                f"note: the recorded test is its pack's (the pack's runs tested in one "
                f"program), recomputed {'as its pack' if stored.pack_runs else 'alone'}: the "
                f"largest difference is {max(relative.values()):.1e} relative")
        if relative and recorded.get("backend") not in (None, jax.default_backend()):
            differences.append(
                f"note: recorded on {recorded['backend']}, recomputed on "
                f"{jax.default_backend()}: the largest difference is {max(relative.values()):.1e} "
                f"relative, the rounding of another backend's kernels; verify on "
                f"{recorded['backend']} for the bit-for-bit check")
    return differences + counted


def tested_in_turn(stored, recorded: dict) -> bool | None:
    """How the recorded test ran each device's tasks (one at a time or one vmap), as a re-test
    on the backend it ran on must, to be bit-equal; None (the learner's rule,
    ``episode.sequential``) on another backend or for a record written before it said (a
    ProtoNets config saved then reads back as ``tasks_on_cpu=vmap``, the rule it ran)."""
    if recorded.get("backend") not in (None, jax.default_backend()):
        return None
    return stored.tasks_in_turn


def cost_differences(config: TrainConfig, learner, splits, recorded: dict) -> list[str]:
    """ATM and the MACs recounted (``COST_METRICS``; from the params' shapes, by XLA's cost
    analysis on CPU whatever the backend, as the run counted them) against the recorded ones.
    A count recorded under another jax version may differ by XLA's cost model: said so."""
    stored = results.test_record(recorded)
    wanted = [name for name in COST_METRICS if getattr(stored, name) is not None]
    if not wanted:
        return []
    from cfsl_jax.protocol import metrics as cost
    from cfsl_jax.training.train import per_task_meta_step_macs
    image_shape = tuple(splits["test"].images.shape[1:])
    with progress.stage("[verify] counting ATM and MACs (XLA cost analysis)"):
        params = jax.device_get(runs.init_params(learner, splits["train"], config.seed))
        now = cost.costs(learner.evaluated, params, image_shape)  # as evaluate counts them
        if stored.macs_per_meta_step is not None:
            now["macs_per_meta_step"] = per_task_meta_step_macs(
                config, learner, params, tuple(splits["train"].images.shape[1:]))
    differences = [f"{name}: recorded {getattr(stored, name)!r}, now {now[name]!r}"
                   for name in wanted if now[name] != getattr(stored, name)]
    rule = recorded.get("macs_rule", 1)
    if differences and rule < cost.MACS_RULE:
        differences.append(f"note: the costs were counted by an older rule ({rule}; now "
                           f"{cost.MACS_RULE}: docs/metrics.md); the test's own numbers are "
                           f"checked apart. `python -m launch.evaluate --workdir=W` re-tests "
                           f"the run and records today's counts")
    elif differences and recorded.get("jax_version") not in (None, jax.__version__):
        differences.append(f"note: the costs were counted with jax {recorded['jax_version']}, "
                           f"recounted with jax {jax.__version__}, whose XLA may count "
                           f"otherwise; recount with jax {recorded['jax_version']}")
    return differences


def tested_mesh(stored):
    """The mesh of as many devices as the run's test had (``EvalRecord.devices``) where this
    process sees that many (a single host), else None (all devices): the 1- and N-device
    programs are partitioned differently and may round differently, even at the same
    per-device batch, so a bit-equal re-test runs on the recorded device count."""
    from cfsl_jax.runtime import parallel
    wanted = stored.devices
    if (isinstance(wanted, int) and 1 <= wanted <= jax.device_count()
            and jax.process_count() == 1):
        return parallel.make_mesh(wanted)
    return None


def _relative_differences(report, stored) -> dict[str, float]:
    """Each checked metric (``CHECKED_METRICS``, ``CHECKED_LISTS`` where the record holds
    them) that differs between a recomputation and the stored record, with its largest
    difference relative to the stored value."""
    out = {name: _relative(getattr(report, name), getattr(stored, name))
           for name in CHECKED_METRICS if getattr(report, name) != getattr(stored, name)}
    for name in CHECKED_LISTS:
        now, then = _values(report, name), _values(stored, name)
        if then and now != then:
            out[name] = (max(_relative(a, b) for a, b in zip(now, then))
                         if len(now) == len(then) else float("inf"))
    return out


def _relative(now: float, then: float) -> float:
    return abs(now - then) / max(abs(then), 1e-30)


def _values(record, name: str) -> list[float]:
    """A list field of a record as one flat list (``per_task``: every task's acc, then CE)."""
    value = getattr(record, name) or ()
    if isinstance(value, dict):
        return [float(v) for key in ("acc", "ce") for v in value.get(key, ())]
    return [float(v) for v in value]


def _difference(name: str, stored, report) -> str:
    """One line saying how ``name`` differs (a list field: how many of its values)."""
    if name not in CHECKED_LISTS:
        return f"{name}: recorded {getattr(stored, name)!r}, now {getattr(report, name)!r}"
    now, then = _values(report, name), _values(stored, name)
    if len(now) != len(then):
        return f"{name}: recorded {len(then)} values, now {len(now)}"
    differ = sum(a != b for a, b in zip(now, then))
    largest = max(_relative(a, b) for a, b in zip(now, then))
    what = "tasks' accuracies and CEs" if name == "per_task" else "class groups' accuracies"
    return (f"{name}: {differ} of the {len(then)} {what} differ (the largest by "
            f"{largest:.1e} relative)")


def match_detail(metrics: bool, costs: bool = True) -> str:
    """What a MATCH means: which numbers were compared, and to what tolerance."""
    counted = (f"; {', '.join(COST_METRICS)} recounted and equal (where recorded)" if costs
               else "; ATM and MACs not recounted (--nocosts)")
    if not metrics:
        return f"task_fingerprint equal{counted}; test metrics not recomputed (--nometrics)"
    return (f"task_fingerprint equal{counted}; test "
            f"{', '.join(CHECKED_METRICS + CHECKED_LISTS)} bit-equal (tolerance 0: verify "
            f"re-tests every run alone, and a run its pack tested, when that differs, as its "
            f"pack's program)")


def packs_note(recorded: dict) -> str | None:
    """A line saying which of the run's steps a pack computed (its results.json's ``packs``),
    or None. verify re-tests and does not re-train; a re-training is bit-equal with the same
    pack settings, and alone may differ by rounding (vmap's batched kernels, or S > 1)."""
    entries = recorded.get("packs", [])
    parts = []
    for i, e in enumerate(entries):
        if e["pack"]:
            after = [n["from_step"] for n in entries[i + 1:] if n["phase"] == e["phase"]]
            steps = (f"{e['from_step']} to {after[0]}" if after else f"from {e['from_step']}")
            rates = e["pack"].get("learning_rates") or []  # recorded since 2026-11-28
            rates = ("" if len(set(rates)) < 2 else
                     f" at learning rates {','.join(map(repr, rates))}")
            parts.append(f"{e['phase']} steps {steps} (seeds "
                         f"{','.join(map(str, e['pack']['seeds']))}{rates}, "
                         f"{e['pack']['axis']}, {e['pack']['steps_per_dispatch']} per call)")
    if not parts:
        return None
    return (f"a pack computed its {'; '.join(parts)}: re-train it with those settings for the "
            f"same numbers")


def reference_row_differences(workdir: str, csv_path: str) -> list[str]:
    """How the row of ``workdir``'s run in a reference results.csv (``experiments.reference``)
    differs from its results.json; a missing row is a difference."""
    from cfsl_jax.experiments import reference
    recorded = results.read_json(files.join(workdir, "results.json"))
    row = reference.find_row(reference.read_rows(csv_path), recorded)
    if row is None:
        return [f"{csv_path} has no complete row of this run"]
    return [f"{csv_path} {line}" for line in reference.row_differences(row, recorded)]
