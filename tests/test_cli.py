"""The command lines as a user meets them: one-line errors with exit status 2, --help that lists
every flag and exits 0, Ctrl-C that checkpoints and says how to resume, memory refused up front,
and progress lines at least every INTERVAL_S while training.

Mistakes are run as subprocesses. To keep that cheap, one subprocess per command runs every
mistake of that command through the command's own ``run()`` (the console-script entry point),
with ``sys.argv[0]`` set to the ``cfsl-*`` script, capturing each invocation's exit status,
stdout and stderr (``DRIVER``); ``python -m launch.NAME`` itself is run where the module path
matters (``--help``, Ctrl-C).
"""

import json
import os
import signal
import subprocess
import sys

import jax
import pytest

from cfsl_jax.runtime import memory, progress, stops
from cfsl_jax.training import runs, train
from cfsl_jax.training.config import TrainConfig
from cfsl_jax.runtime.errors import UserError
from conftest import interruptible_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
TINY_ARGS = ["--task=b2", "--nc=3", "--kt=2", "--learner_option=filters=8",
             "--dataset_option=num_classes=60", "--dataset_option=samples_per_class=8",
             "--epochs=2", "--iters_per_epoch=3", "--meta_batch=2", "--val_tasks=6",
             "--test_tasks=7", "--eval_batch=4", "--keep_best=2"]
LEARNERS_ENUM = "<protonets|init_tune|pretrain_tune|ewc_init|ewc_pretrain|maml_low|maml_high|sca>"

DRIVER = r"""
import contextlib, importlib, io, json, sys
from absl import flags
module, script, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
command = importlib.import_module(module)
results = []
for argv in cases:
    out, err = io.StringIO(), io.StringIO()
    flags.FLAGS.unparse_flags()
    sys.argv = [script, *argv]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            command.run()
        except SystemExit as exit:
            code = 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 1
    results.append([code, out.getvalue(), err.getvalue()])
sys.__stdout__.write("RESULTS " + json.dumps(results) + "\n")
"""


def run_cases(command: str, cases: list[list[str]], env: dict | None = None) -> list:
    """[(exit status, stdout, stderr)] of ``cfsl-<command> *argv`` for each argv, in one process."""
    script = os.path.join(BIN, f"cfsl-{command.replace('_', '-')}")
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, f"cfsl_jax.launch.{command}", script, json.dumps(cases)],
        cwd="/", capture_output=True, text=True, env={**os.environ, **(env or {})})
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, result.stderr[-3000:]
    return json.loads(lines[-1][len("RESULTS "):])


def assert_error(outcome, expected: str) -> None:
    """Exit status 2, no traceback, and stderr is exactly one line starting ``error: <expected>``."""
    code, _, stderr = outcome
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert expected in lines[0], lines[0]


HELP_FLAGS = {
    "train": ["--manual_dir", "--data_dir", "--dataset_option", "--download", "--retest",
              "--test_tasks", "--learner_option", "--list_options", "--verbose"],
    "evaluate": ["--workdir", "--learner", "--test_tasks", "--manual_dir", "--verbose"],
    "verify": ["--workdir", "--metrics", "--verbose"],
    "show_task": ["--task", "--manual_dir", "--dataset_option", "--verbose"],
    "sweep": ["--learners", "--cells", "--dry_run", "--epochs", "--iters_per_epoch",
              "--test_tasks", "--learner_option", "--manual_dir", "--verbose"],
    "report": ["--sweep_dir", "--figure", "--nss", "--verbose"],
    "fluid": ["--workdir", "--method", "--method_option", "--list_options", "--manual_dir",
              "--verbose"],
}


def assert_help(outcome, command: str) -> None:
    """``--help`` exits 0 and lists every flag of the command (with its help string)."""
    code, stdout, stderr = outcome
    assert code == 0, stderr
    for flag in HELP_FLAGS[command]:
        assert f"  {flag}: " in stdout or f"  --[no]{flag[2:]}: " in stdout, (command, flag)
    assert "error" not in stderr


def write_tiny_workdir(workdir: str, seed: int = 0) -> None:
    config = TrainConfig(
        learner_options={"filters": 8}, dataset_options={"num_classes": 60,
                                                         "samples_per_class": 8},
        task="B2", spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=3, meta_batch=2,
        val_tasks=6, test_tasks=7, eval_batch=4, keep_best=2, seed=seed)
    runs.check_workdir_config(workdir, config)


def test_train_mistakes_are_one_line_with_status_2(tmp_path, omniglot_dir, data_dir,
                                                   omniglot_splits):
    workdir, a_file = str(tmp_path / "w"), str(tmp_path / "a_file")
    open(a_file, "w").close()
    taken, truncated = str(tmp_path / "taken"), str(tmp_path / "truncated")
    write_tiny_workdir(taken, seed=0)
    write_tiny_workdir(truncated, seed=0)
    with open(os.path.join(truncated, "config.json"), "r+") as f:
        f.truncate(40)  # as a kill in the middle of a non-atomic write would leave it
    os.remove(os.path.join(truncated, "checksums.json"))  # (that is, before checksums)
    empty, offline, corrupt = (str(tmp_path / name) for name in ("empty", "offline", "corrupt"))
    for folder in (empty, offline, corrupt):
        os.makedirs(folder)
    for name in ("images_background_small1.zip", "images_background_small2.zip"):
        with open(os.path.join(corrupt, name), "wb") as f:
            f.write(b"PK\x03\x04 not a zip archive at all")
    small = ["--dataset=omniglot/small", f"--manual_dir={omniglot_dir}", f"--data_dir={data_dir}"]
    cases = {
        "help": ["--help"],
        "bad learner": ["--learner=nope", f"--workdir={workdir}"],
        "test_tasks": ["--test_tasks=0", f"--workdir={workdir}"],
        "deprecated eval_tasks": ["--eval_tasks=0", f"--workdir={workdir}"],
        "learner option": ["--learner=init_tune", "--learner_option=inner_step=2",
                           f"--workdir={workdir}"],
        "learner option value": ["--learner=init_tune", "--learner_option=conv=cudnn",
                                 f"--workdir={workdir}"],
        "learner option type": ["--learner=maml_low", "--learner_option=inner_steps=two",
                                f"--workdir={workdir}"],
        "list options": ["--learner=maml_high", "--list_options"],
        "dataset option": ["--dataset_option=nope=1", f"--workdir={workdir}"],
        "task": ["--task=q3", f"--workdir={workdir}"],
        "no workdir": [],
        "extra": ["extra", f"--workdir={workdir}"],
        "workdir is a file": [*TINY_ARGS, f"--workdir={a_file}"],
        "other config": [*TINY_ARGS, "--seed=1", f"--workdir={taken}"],
        "truncated config": [*TINY_ARGS, f"--workdir={truncated}"],
        "val split too small": ["--dataset=omniglot", *small[1:], "--task=B10",
                                f"--workdir={workdir}"],
        "nc too large for val": ["--task=B5", "--nc=50", f"--workdir={workdir}"],
        "no archives": ["--dataset=omniglot/small", f"--manual_dir={empty}",
                        f"--data_dir={str(tmp_path / 'd1')}", f"--workdir={workdir}"],
        "offline, no manual_dir": ["--dataset=omniglot", f"--data_dir={offline}",
                                   f"--workdir={workdir}"],
        "corrupt archive": ["--dataset=omniglot/small", f"--manual_dir={corrupt}",
                            f"--data_dir={str(tmp_path / 'd2')}", f"--workdir={workdir}"],
        "verbose": ["--test_tasks=0", "--verbose", f"--workdir={workdir}"],
        "negative seed": ["--seed=-1", f"--workdir={workdir}"],
        "infinite rate": ["--learning_rate=inf", f"--workdir={workdir}"],
        "synthetic size": ["--dataset_option=samples_per_class=0", "--validate_only",
                           f"--workdir={workdir}"],
    }
    out = dict(zip(cases, run_cases("train", list(cases.values()))))
    assert_help(out["help"], "train")
    assert_error(out["bad learner"], f"flag --learner=nope: value should be one of {LEARNERS_ENUM}")
    assert_error(out["test_tasks"], "--test_tasks must be a positive integer, got 0")
    assert_error(out["negative seed"], "--seed must be an integer >= 0, got -1")
    assert_error(out["infinite rate"], "--learning_rate must be a finite number > 0, got inf")
    assert_error(out["synthetic size"], "synthetic option samples_per_class must be a positive "
                                        "integer, got 0")  # --validate_only passed it
    code, _, stderr = out["deprecated eval_tasks"]  # one deprecation line, then the error
    assert code == 2 and stderr.strip().splitlines() == [
        "warning: --eval_tasks is deprecated; use --test_tasks",
        "error: --test_tasks must be a positive integer, got 0"], stderr
    assert_error(out["learner option"], "--learner_option for --learner=init_tune: no option "
                                        "inner_step; valid: activation, adapt_norm, conv, ")
    assert_error(out["learner option value"], "--learner_option for --learner=init_tune: option "
                                              "conv='cudnn' must be one of ('auto', 'gemm_grad', "
                                              "'im2col', 'xla')")
    assert_error(out["learner option type"], "--learner_option for --learner=maml_low: option "
                                             "inner_steps=two must be an integer")
    code, stdout, stderr = out["list options"]
    assert code == 0 and not stderr, stderr
    assert "  inner_steps: int = 5\n      S: SGD steps on each support set. (>= 1)" in stdout
    assert "  embed_init: str = 'torch'\n" in stdout and "One of xavier, torch, lecun." in stdout
    assert_error(out["dataset option"], "num_classes")
    assert_error(out["task"], "--task: cannot parse task 'Q3'")
    assert_error(out["no workdir"], "--workdir is required")
    assert_error(out["extra"], "unexpected arguments ['extra']")
    assert_error(out["workdir is a file"], f"--workdir={a_file} is a file")
    assert_error(out["other config"], "holds a run with a different config (fields: seed)")
    assert_error(out["truncated config"], f"{truncated}/config.json is not valid JSON (truncated "
                                          f"or corrupt: ")
    assert_error(out["val split too small"], "--task=B10 cannot be sampled from the val split of "
                                             "omniglot/small_nearest: ")  # the variant it read
    assert "50 distinct classes, but the split has 31" in out["val split too small"][2]
    with open(os.path.join(REPO, "README.md")) as f:  # the README's example is the real line
        assert out["val split too small"][2].strip() in " ".join(f.read().split())
    assert_error(out["nc too large for val"], "cannot be sampled from the val split of synthetic")
    assert "250 distinct classes, but the split has 211" in out["nc too large for val"][2]
    assert_error(out["no archives"], f"--manual_dir={empty}: images_background_small1.zip, "
                                     "images_background_small2.zip not found there")
    assert_error(out["offline, no manual_dir"], "--manual_dir")
    assert "--download" in out["offline, no manual_dir"][2]
    assert os.listdir(offline) == []  # nothing left behind
    assert_error(out["corrupt archive"], "images_background_small")
    code, _, stderr = out["verbose"]
    assert code == 2 and "Traceback" in stderr
    assert stderr.strip().splitlines()[-1] == "error: --test_tasks must be a positive integer, got 0"
    assert not os.path.exists(workdir)  # no refused run wrote anything


def test_other_commands_mistakes_are_one_line_with_status_2(tmp_path, omniglot_dir, data_dir,
                                                            omniglot_splits):
    missing = str(tmp_path / "missing")
    small = ["--dataset=omniglot/small", f"--manual_dir={omniglot_dir}", f"--data_dir={data_dir}"]
    evaluate = run_cases("evaluate", [[f"--workdir={missing}"],
                                      ["--learner=protonets", f"--workdir={missing}"], ["-h"]])
    assert_error(evaluate[0], f"--workdir={missing} does not exist")
    assert_error(evaluate[1], "--learner=protonets is meta-trained: run launch.train first")
    assert_help(evaluate[2], "evaluate")
    corrupt = str(tmp_path / "sweep_done" / "run")
    write_tiny_workdir(corrupt)
    with open(os.path.join(corrupt, "results.json"), "w") as f:
        f.write('{"learner": "protonets", "test": {"acc_m')
    verify = run_cases("verify", [[f"--workdir={missing}"], ["--help"],
                                  [f"--workdir={corrupt}"], []])
    assert_error(verify[0], f"--workdir={missing} does not exist")
    assert_help(verify[1], "verify")
    assert_error(verify[2], f"{corrupt}/results.json is not valid JSON")
    assert_error(verify[3], "--workdir is required")  # as the other commands say it
    show = run_cases("show_task", [["--dataset=nope"], ["--task=z9"],
                                   [*small, "--split=val", "--task=B10"], ["--help"]])
    assert_help(show[3], "show_task")
    assert_error(show[0], "flag --dataset=nope: value should be one of <synthetic|omniglot|")
    assert_error(show[1], "--task")
    assert_error(show[2], "--task=B10 cannot be sampled from the val split of omniglot/small")
    sweep_dir = str(tmp_path / "sweep")
    sweep = run_cases("sweep", [[f"--workdir={sweep_dir}", "--task=B3"],
                                [f"--workdir={sweep_dir}", "--learner_option=nope=1",
                                 "--learners=protonets"],
                                [f"--workdir={sweep_dir}", *small, "--learners=protonets",
                                 "--cells=b3,B10", "--seeds=0", "--dry_run"], ["--help"]])
    assert_help(sweep[3], "sweep")
    assert_error(sweep[0], "--task is one run's flag; a sweep takes --cells")
    assert_error(sweep[1], "--learner_option nope: no learner of the sweep takes it; valid: ")
    code, stdout, _ = sweep[2]
    assert code == 0
    lines = stdout.splitlines()
    assert lines[-1] == "2 runs: 1 impossible, 1 new"
    assert any(line.startswith("impossible omniglot/small/protonets/B10/seed0") and
               "cannot be sampled from the val split of omniglot/small" in line for line in lines)
    not_reference = tmp_path / "not_reference"
    not_reference.mkdir()
    (not_reference / "results.csv").write_text("learner,seed\nprotonets,0\n")
    report = run_cases("report", [[], ["--help"], [f"--sweep_dir={tmp_path / 'sweep_done'}"],
                                  ["--reference", f"--reference_dir={not_reference}",
                                   f"--out_dir={tmp_path / 'report'}"]])
    assert_error(report[0], "give --sweep_dir")
    assert_help(report[1], "report")
    assert_error(report[2], f"{corrupt}/results.json is not valid JSON")
    assert not os.path.exists(tmp_path / "sweep_done" / "report")  # refused: no folder left
    assert_error(report[3], f"{not_reference}/results.csv is not a reference results.csv "
                            f"(written by benchmarks.reference.export): it has no column "
                            f"dataset, cell, budget, paper_budget, ...")
    assert not os.path.exists(tmp_path / "report")
    assert not os.path.exists(sweep_dir) and not os.path.exists(missing)


def test_fluid_help_list_options_and_option_mistakes():
    help_, listed, value, name, no_workdir, grid, alone, size = run_cases("fluid", [
        ["--help"], ["--method=ncm,lwf", "--list_options"],
        ["--method_option=lwf:momentum=1", "--workdir=/nonexistent/f"],
        ["--method_option=ncm:learning_rate=0.1", "--workdir=/nonexistent/f"], [],
        ["--study=update_strategy", "--study_frequencies=13,abc", "--workdir=/nonexistent/f"],
        ["--batch_size=16", "--workdir=/nonexistent/f"],
        ["--dataset_option=num_classes=-5", "--workdir=/nonexistent/f"]])
    assert_help(help_, "fluid")
    code, stdout, stderr = listed
    assert code == 0 and not stderr, stderr
    assert "options of FLUID method ncm" in stdout and "  metric: str = 'euclidean'" in stdout
    assert "  distill_temperature: float = 2.0\n      Distillation temperature T. (> 0)" in stdout
    assert_error(value, "--method_option for lwf: option momentum=1.0 must be a number >= 0 and "
                        "< 1")
    assert_error(name, "--method_option for ncm: no option learning_rate; valid: activation, ")
    assert_error(no_workdir, "--workdir is required")
    assert_error(grid, "--study_frequencies=13,abc: abc is not an integer >= 1")
    assert_error(alone, "--batch_size=16 sets the schedule of --update_every: give "
                        "--update_every too")  # it was ignored
    assert_error(size, "synthetic option num_classes must be an integer >= 3, got -5")


def test_help_of_python_m_lists_every_flag_from_any_folder():
    result = subprocess.run([sys.executable, "-m", "cfsl_jax.launch.train", "--help"], cwd="/",
                            capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.startswith("Train (or pretrain) a learner")
    for flag in ("--learner:", "--manual_dir:", "--[no]download:", "--[no]verbose:"):
        assert flag in result.stdout, flag
    data_dir = result.stdout.split("--data_dir:")[1].split("\n  --")[0]
    assert "$CFSL_DATA_DIR" in data_dir and "~/tensorflow_datasets" in data_dir, data_dir


def test_sigterm_checkpoints_training_and_says_how_to_resume(tmp_path):
    """SLURM's stop: SIGTERM (a command stopped by a signal exits with 128 + its number)."""
    workdir = str(tmp_path / "run")
    process = subprocess.Popen(
        interruptible_module("launch.train", *TINY_ARGS, "--epochs=100", "--log_every=1",
                             f"--workdir={workdir}"), cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "CFSL_PROGRESS": "1"})
    try:
        for line in process.stdout:  # wait until meta-training runs
            if line.startswith("[train] ") and " steps " in line:
                break
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    step = int(last.split()[5])
    assert last.startswith("interrupted by SIGTERM at step ") and last.endswith(
        f"checkpointed at step {step} in {workdir}: re-run the same command to resume"), last
    assert max(map(int, os.listdir(os.path.join(workdir, "checkpoints", "latest")))) == step
    with open(os.path.join(workdir, "flags.txt")) as f:  # --flagfile=W/flags.txt resumes it
        written = f.read().splitlines()
    assert f"--workdir={os.path.realpath(workdir)}" in written
    assert {"--epochs=100", "--log_every=1", "--task=b2", "--learner_option=filters=8"} <= set(
        written)


def test_cpu_memory_limit_is_the_ram_available_without_the_arguments(monkeypatch):
    monkeypatch.setattr(memory, "available_ram", lambda: 1024)
    assert memory.device_limit(jax.devices("cpu")[0]) == (1024, False)


def test_out_of_memory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # 1 KiB on whatever backend runs the test: host RAM on CPU, the device's limit elsewhere.
    monkeypatch.setattr(memory, "device_limit", lambda device: (1024, device.platform != "cpu"))
    workdir = str(tmp_path / "run")
    config = TrainConfig(
        learner_options={"filters": 8}, dataset_options={"num_classes": 60,
                                                         "samples_per_class": 8},
        task="B2", spec_overrides={"nc": 3, "kt": 2}, epochs=1, iters_per_epoch=2, meta_batch=2,
        val_tasks=4, test_tasks=4, eval_batch=4, keep_best=1)
    with pytest.raises(UserError, match=r"one meta-training step of protonets on B2\(.*\) needs "
                                        r"\d+\.\d GiB per device \(XLA's estimate\), more than the "
                                        r"0\.0 GiB (of RAM available|on .+); lower --meta_batch \(now 2\)"):
        train.train_and_evaluate(config, workdir)
    assert not os.path.exists(workdir)


def test_xla_out_of_memory_becomes_one_line(capsys):
    import jax
    from cfsl_jax.launch import cli

    with pytest.raises(SystemExit) as exit:
        with cli.boundary():
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating "
                                             "38654705664 bytes.\nmore XLA detail")
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: out of device memory (RESOURCE_EXHAUSTED: Out of memory allocating "
                   "38654705664 bytes.); lower --meta_batch, --eval_batch, --nc, --nss or --kt, "
                   "or use --compute_dtype=bfloat16"]
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        with cli.boundary():
            1 / 0
    with pytest.raises(RuntimeError):  # the same words in another error class are not memory
        with cli.boundary():
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes.")


def test_progress_lines_give_rate_and_eta(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(progress, "clock", lambda: now[0])
    bar = progress.tracker("train", 100, "steps")
    now[0] = 8.0  # the first 10 steps include compiling
    assert bar.update(10, loss=1.5)  # the first update prints
    now[0] = 10.0
    assert not bar.update(20)  # under INTERVAL_S since the last line
    now[0] = 18.0
    assert bar.update(60, acc=0.25)
    now[0] = 26.0
    assert bar.update(100)  # the last update prints
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[train] 10/100 steps (10%), loss 1.5, "
                     "first 10 steps: 8.0s, not in the rate",
                     "[train] 60/100 steps (60%), 5 steps/s, acc 0.25, ETA 8.0s",
                     "[train] 100/100 steps (100%), 5 steps/s, done in 26.0s"]
    assert progress.duration(75.3) == "1m15s" and progress.duration(4000) == "1h06m"


def test_a_ctrl_c_dropped_in_a_callback_is_raised_at_the_next_progress_update(monkeypatch,
                                                                                capsys):
    """Python drops an exception raised in ``__del__`` or a gc callback; the sweep test saw a
    Ctrl-C lost that way in jax's gc callback (and its traceback printed)."""
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    previous = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stops.install()

        class Finalised:
            def __del__(self):
                signal.raise_signal(signal.SIGINT)  # the handler runs inside __del__

        Finalised()  # dropped at once: its __del__ runs, the KeyboardInterrupt is lost
        assert stops.pending() == signal.SIGINT
        assert capsys.readouterr().err == ""  # not "Exception ignored in ..."
        with pytest.raises(stops.StopRequested) as raised:
            progress.tracker("train", 10, "steps").update(1)
        assert raised.value.exit_status == 130
    finally:
        stops.clear()
        signal.signal(signal.SIGINT, previous)


def test_training_never_goes_15_s_without_a_progress_line(tmp_path, monkeypatch):
    """A real training run under a clock that advances 1 s per reading: with log_every far
    beyond the run, every line is time-based, and no 15 s pass without one."""
    now, lines = [0.0], []

    def clock():
        now[0] += 1.0
        return now[0]

    monkeypatch.setattr(progress, "clock", clock)
    monkeypatch.setattr(progress, "say", lambda line: lines.append((now[0], line)))
    config = TrainConfig(
        learner_options={"filters": 8}, dataset_options={"num_classes": 60,
                                                         "samples_per_class": 8},
        task="B2", spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=20, meta_batch=2,
        val_tasks=6, test_tasks=7, eval_batch=2, keep_best=1, log_every=10_000)
    train.train_and_evaluate(config, str(tmp_path / "run"))
    first = next(i for i, (_, line) in enumerate(lines) if "compiling" in line)
    times = [t for t, _ in lines[first:]]
    assert max(b - a for a, b in zip(times, times[1:])) <= 15
    steps = [line for _, line in lines if line.startswith("[train] ") and " steps " in line]
    assert len(steps) >= 4 and steps[-1].startswith("[train] 40/40 steps (100%)")
