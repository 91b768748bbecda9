"""Progress lines driven by time: a slow update is covered by "still working" lines for as long
as the function that made the tracker runs, and a command's first line comes before JAX loads."""

import os
import subprocess
import sys
import time

from cfsl_jax.runtime import progress

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_slow_update_is_covered_by_lines_until_its_function_returns(monkeypatch, capsys):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.25)

    def phase():
        bar = progress.tracker("eval", 600, "tasks", interval=0.25)
        bar.update(100)
        time.sleep(1.4)  # one chunk of tasks that takes many intervals

    phase()
    during = capsys.readouterr().out.splitlines()
    time.sleep(1.2)  # the phase is over: the heartbeat has stopped
    after = capsys.readouterr().out.splitlines()
    still = [line for line in during if "still working" in line]
    assert during[0] == "[eval] 100/600 tasks (17%)"
    assert 3 <= len(still) <= 6, during
    assert all(line.startswith("[eval] 100/600 tasks, still working (") for line in still)
    assert after == []


class _Clocked:
    """A stdout that notes when each line was written."""

    def __init__(self):
        self.times: list[float] = []

    def write(self, text: str) -> int:
        self.times += [time.monotonic()] * text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass


def test_no_two_lines_of_a_slow_phase_are_more_than_the_heartbeat_apart(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1.0)
    clocked = _Clocked()
    monkeypatch.setattr(sys, "stdout", clocked)

    def phase():
        bar = progress.tracker("eval", 600, "tasks")
        bar.update(50)
        time.sleep(0.5)  # a line between two of the heartbeat's polls
        bar.update(100, force=True)
        time.sleep(3.6)

    phase()
    gaps = [b - a for a, b in zip(clocked.times, clocked.times[1:])]
    assert len(gaps) >= 3 and max(gaps) < 1.3, gaps  # a line within 1 s, never a second late


def test_an_evaluation_inside_training_beats_from_the_trainings_last_line(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 1.0)
    clocked = _Clocked()
    monkeypatch.setattr(sys, "stdout", clocked)
    with progress.tracker("train", 10, "steps") as train:
        train.update(1)  # a line; then steps that print none
        time.sleep(0.7)
        with progress.tracker("val", 100, "tasks", first_line=False):  # quiet at first
            time.sleep(1.6)
    gaps = [b - a for a, b in zip(clocked.times, clocked.times[1:])]
    # the validation's first "still working" line comes 1 s after the training's line, not
    # 1 s after the validation began (1.7 s of silence)
    assert len(gaps) >= 1 and max(gaps) < 1.3, gaps


def test_only_the_innermost_running_tracker_beats(monkeypatch, capsys):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.25)
    def validate():
        bar = progress.tracker("val", 100, "tasks", interval=0.25)
        bar.update(10)
        time.sleep(0.9)

    def train():
        bar = progress.tracker("train", 10, "steps", interval=0.25)
        bar.update(1)
        validate()  # the training tracker keeps quiet while the validation one runs
        bar = progress.tracker("train", 10, "steps", start=1, interval=0.25)  # replaces it
        bar.update(2)
        time.sleep(0.9)

    train()
    still = [line for line in capsys.readouterr().out.splitlines() if "still working" in line]
    assert [line.split(",")[0] for line in still] == (
        ["[val] 10/100 tasks"] * len([s for s in still if s.startswith("[val]")])
        + ["[train] 2/10 steps"] * len([s for s in still if s.startswith("[train]")]))
    assert {line.split(",")[0] for line in still} == {"[val] 10/100 tasks", "[train] 2/10 steps"}
    assert len(still) <= 8


def test_a_command_says_it_started_before_it_imports_jax():
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "launch.verify", "--workdir=/nonexistent"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    first = process.stdout.readline()
    first_after = time.monotonic() - started
    _, stderr = process.communicate()
    finished_after = time.monotonic() - started
    assert first == "[verify] starting\n"
    assert stderr.strip() == "error: --workdir=/nonexistent does not exist"
    assert first_after < 3.0 and first_after < finished_after / 2, (first_after, finished_after)


def test_a_slow_start_is_covered_by_lines_until_the_command_begins(capsys):
    import threading

    from cfsl_jax.launch import starting
    threads = threading.active_count()
    with starting.starting("report", period=0.25):
        time.sleep(0.9)  # importing JAX on a loaded machine
    during = capsys.readouterr().out.splitlines()
    assert threading.active_count() == threads  # leaving the block ended its thread
    time.sleep(0.6)
    assert during[0] == "[report] starting"
    during = during[1:]
    assert 2 <= len(during) <= 4, during
    assert all(line.startswith("  still [report] starting (") and
               line.endswith("s: importing JAX and the command's modules)") for line in during)
    assert capsys.readouterr().out == ""
    assert starting.STARTING_HEARTBEAT_S < progress.INTERVAL_S


IMPORT_ALL = r"""
import importlib, pkgutil, sys, threading
sys.path.insert(0, sys.argv[1])
import cfsl_jax, cfsl_jax.datasets, cfsl_jax.launch
from launch_inprocess import command_module
COMMANDS = ("show_task", "train", "evaluate", "verify", "sweep", "report", "fluid")
names = sorted({m.name for path, prefix in (
    (cfsl_jax.__path__, "cfsl_jax."), (cfsl_jax.datasets.__path__, "cfsl_jax.datasets."),
    (cfsl_jax.launch.__path__, "cfsl_jax.launch.")) for m in pkgutil.walk_packages(path, prefix)})
for name in names:
    if name.rpartition(".")[2] not in COMMANDS:
        importlib.import_module(name)
for command in COMMANDS:  # each with its own flags (theirs overlap)
    with command_module(command):
        pass
print(len(names), threading.active_count(), file=sys.stderr)
"""


def test_importing_any_module_prints_nothing_and_starts_no_thread(tmp_path):
    """Not even in a process whose name is a command's (``cfsl-*``): a command prints its first
    line itself (``launch.starting``), and a heartbeat's thread lives in a ``with`` block."""
    script = tmp_path / "cfsl-import-all"
    script.write_text(IMPORT_ALL)
    result = subprocess.run([sys.executable, str(script), os.path.dirname(__file__)], cwd=REPO,
                            capture_output=True, text=True,
                            env={**os.environ, "CFSL_PROGRESS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    modules, threads = map(int, result.stderr.split()[-2:])
    assert modules > 80 and threads == 1, result.stderr[-3000:]


def test_a_repeated_count_says_what_its_time_is_since(capsys, monkeypatch):
    """(It said '... since the start' of nothing named, and 'since the last count' for a count
    that the device had long passed.)"""
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.25)

    def phase():
        bar = progress.tracker("val", 100, "tasks", interval=0.25)
        time.sleep(0.6)  # compiling: no count yet
        bar.update(10)
        time.sleep(0.6)

    phase()
    still = [line for line in capsys.readouterr().out.splitlines() if "still working" in line]
    assert still[0].startswith("[val] 0/100 tasks, still working (")
    assert still[0].endswith(" since [val] began)")
    assert still[-1].startswith("[val] 10/100 tasks, still working (")
    assert still[-1].endswith(" since this count was read; work dispatched since is not "
                              "counted yet)")
