"""A whole sweep packed against unpacked: wall time, compilation and evaluation included.

    python benchmarks/sweep_packing.py --learner=protonets --cell=B3 --seeds=0,1,2 --pack=3

Runs ``python -m launch.sweep`` twice over the same runs (the seeds of one learner and cell),
one after the other on this machine, each into its own new folder: first with ``--pack=1``
(every run alone), then with ``--pack=K``. Both use ``--workers=1``, so the comparison is
one program at a time either way. Prints each sweep's wall time, the ratio packed/unpacked
(issue 28's CPU target: at most 0.8 for three seeds), and per run the test accuracy and CE
of both and whether their test-task fingerprints agree; then one JSON line.

The run settings default to a short schedule (``--epochs=2 --iters_per_epoch=25
--meta_batch=8 --val_tasks=50 --test_tasks=200``), where start-up, compilation and
evaluation are a visible share of a run; ``--sweep_flag`` passes any other sweep flag
(repeat it), e.g. ``--sweep_flag=--dataset=omniglot --sweep_flag=--manual_dir=DIR``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from cfsl_jax.training import results, tracking

_LEARNER = flags.DEFINE_string("learner", "protonets", "The learner.")
_CELL = flags.DEFINE_string("cell", "B3", "The cell.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "The runs' seeds.")
_PACK = flags.DEFINE_integer("pack", 3, "The packed sweep's --pack.", lower_bound=2)
_SCHEDULE = flags.DEFINE_list(
    "schedule", ["--epochs=2", "--iters_per_epoch=25", "--meta_batch=8", "--val_tasks=50",
                 "--test_tasks=200"], "Run flags shared by both sweeps.")
_EXTRA = flags.DEFINE_multi_string("sweep_flag", [], "Another launch.sweep flag (repeatable).")
_KEEP = flags.DEFINE_string("keep", None, "Keep the two sweep folders here (default: a "
                            "temporary folder, removed).")


def sweep(workdir: str, pack: int) -> float:
    """Seconds of one ``launch.sweep`` into ``workdir`` (its output in ``workdir + '.log'``)."""
    command = [sys.executable, "-m", "launch.sweep", f"--workdir={workdir}",
               f"--learners={_LEARNER.value}", f"--cells={_CELL.value}",
               f"--seeds={','.join(_SEEDS.value)}", f"--pack={pack}", "--workers=1",
               "--report=false", *_SCHEDULE.value, *_EXTRA.value]
    print(f"[sweep_packing] --pack={pack}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(workdir + ".log", "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return time.perf_counter() - started


DONE = re.compile(r"^(?:([^\[]+?): )?\[(\w+)\] (compiling)?.*done in (?:(\d+)m)?([\d.]+)s")
TRAINING = ("train", "pretrain")  # the phases of training steps


def breakdown(log_path: str, total: float, workdir: str) -> dict[str, float]:
    """Seconds by stage: compile, train, val, test; ``other`` (start-up, data, building,
    restoring, checkpoints, ATM and MACs) is the rest of ``total``. Validation, test and
    compilations from the sweep's progress lines ("... done in [Xm]Ys"). Training from each
    run's metrics.jsonl (every logged window's steps over its ``steps_per_s``), a window that a
    pack of K computed counted 1/K for each of its runs (``packs.json``: the pack of each phase
    from its first step on); a run whose training logs no windows (pretraining on uniform
    images, ``plain_loop.run_steps``) from its own "done in" lines."""
    spent = dict.fromkeys(("compile", "train", "val", "test"), 0.0)
    logged = set()  # the runs (learner/cell/seed, as the log names them) with windows
    for root, _, names in os.walk(workdir):
        if "metrics.jsonl" not in names:
            continue
        packs = results.read_json(os.path.join(root, results.PACKS_FILE), default=[])
        last = {}
        for row in tracking.read(os.path.join(root, tracking.METRICS_FILE)):
            phase = row.get("phase")
            if phase not in TRAINING or not row.get("steps_per_s"):
                continue
            steps, last[phase] = row["step"] - last.get(phase, 0), row["step"]
            size = ([len(e["pack"]["seeds"]) if e["pack"] else 1 for e in packs
                     if e["phase"] == phase and e["from_step"] < row["step"]] or [1])[-1]
            spent["train"] += steps / row["steps_per_s"] / size
            logged.add("/".join(root.split(os.sep)[-3:]))
    with open(log_path) as log:
        for line in log:
            match = DONE.search(line)
            if not match or "MACs" in line or "restoring" in line:
                continue
            run, stage, compiling, minutes, seconds = match.groups()
            if compiling:
                stage = "compile"
            elif stage in TRAINING:
                if run is None or run in logged or run.startswith("pack of"):
                    continue  # counted from metrics.jsonl above
                stage = "train"
            elif stage not in spent:
                continue
            spent[stage] += 60 * int(minutes or 0) + float(seconds)
    spent["other"] = total - sum(spent.values())
    return {k: round(v, 1) for k, v in spent.items()}


def finished(workdir: str) -> dict[str, dict]:
    """{seed folder: results.json} of every run under ``workdir``."""
    found = {}
    for root, _, files in os.walk(workdir):
        if "results.json" in files and os.path.basename(root).startswith("seed"):
            with open(os.path.join(root, "results.json")) as f:
                found[os.path.basename(root)] = json.load(f)
    return found


def main(argv) -> None:
    del argv
    with tempfile.TemporaryDirectory() as scratch:
        base = _KEEP.value or scratch
        solo_dir, pack_dir = os.path.join(base, "pack1"), os.path.join(base, f"pack{_PACK.value}")
        for folder in (solo_dir, pack_dir):
            if os.path.exists(folder):  # a sweep there would resume, not measure
                sys.exit(f"sweep_packing: --keep={base} already holds {folder}; "
                         "give an empty or new folder")
        os.makedirs(base, exist_ok=True)
        solo_s = sweep(solo_dir, 1)
        pack_s = sweep(pack_dir, _PACK.value)
        solo, packed = finished(solo_dir), finished(pack_dir)
        stages = {"solo": breakdown(solo_dir + ".log", solo_s, solo_dir),
                  "packed": breakdown(pack_dir + ".log", pack_s, pack_dir)}
    for name, spent in stages.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items()),
              file=sys.stderr)
    runs = []
    for seed in sorted(solo):
        a, b = solo[seed]["test"], packed[seed]["test"]
        runs.append({"run": seed, "acc_solo": a["acc_mean"], "acc_packed": b["acc_mean"],
                     "ce_solo": a["ce_mean"], "ce_packed": b["ce_mean"],
                     "same_tasks": (solo[seed]["task_fingerprint"]
                                    == packed[seed]["task_fingerprint"])})
        print(f"{seed}: acc {a['acc_mean']:.4f} alone, {b['acc_mean']:.4f} packed; "
              f"CE {a['ce_mean']:.4f} / {b['ce_mean']:.4f}; "
              f"same test tasks: {runs[-1]['same_tasks']}", file=sys.stderr)
    ratio = pack_s / solo_s
    print(f"{_LEARNER.value} {_CELL.value} seeds {','.join(_SEEDS.value)}: --pack=1 {solo_s:.0f} s, "
          f"--pack={_PACK.value} {pack_s:.0f} s, ratio {ratio:.2f} (target <= 0.8)",
          file=sys.stderr)
    print(json.dumps({"learner": _LEARNER.value, "cell": _CELL.value, "seeds": _SEEDS.value,
                      "pack": _PACK.value, "schedule": _SCHEDULE.value, "extra": _EXTRA.value,
                      "solo_s": solo_s, "packed_s": pack_s, "ratio": ratio, "runs": runs,
                      "stages": stages,
                      "load_average": os.getloadavg()}))


if __name__ == "__main__":
    app.run(main)
