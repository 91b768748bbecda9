"""Packed training (many seeds in one vmapped program) and S steps per dispatch: every run of a
pack, and a run trained S steps per call, samples the tasks it samples alone and ends at the
solo run's numbers within the rounding of XLA's batched kernels (docs/results.md)."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax.experiments.verify import match_detail, packs_note, verify
from cfsl_jax.runtime import checksums, locks, seeding
from cfsl_jax.runtime.errors import UserError
from cfsl_jax.training import loop, packing, results, runs, steps, train
from cfsl_jax.training.config import TrainConfig
from conftest import TEST_PRECISION, unoptimised_env

CONFIG = TrainConfig(
    learner="protonets", learner_options={"filters": 8}, dataset="synthetic",
    dataset_options={"num_classes": 60, "samples_per_class": 8}, task="B2",
    spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=4, meta_batch=2,
    val_tasks=6, test_tasks=7, eval_batch=4, keep_best=2, log_every=2)
SEEDS = (0, 1, 2)
STEPS = 4


@pytest.fixture(scope="module")
def built():
    learner, splits = runs.build(CONFIG)
    optimizer = train.make_optimizer(CONFIG)
    params = [runs.init_params(learner, splits["train"], seed) for seed in SEEDS]
    return learner, splits["train"], optimizer, params


def progress(first, count):  # as the one-step loop computes it
    return jnp.asarray([np.float32((first + i) / STEPS) for i in range(count)])


def solo(learner, split, optimizer, params):
    """Each seed alone, one step per call: (final params, losses [STEPS]) per seed."""
    step = train.make_train_step(learner, optimizer, CONFIG.meta_batch)
    out = []
    for seed, p in zip(SEEDS, params):
        key, opt_state, losses = seeding.purpose_key(seed, "train"), optimizer.init(p), []
        for s in range(STEPS):
            p, opt_state, metrics = step(p, opt_state, split, jax.random.fold_in(key, s),
                                         jnp.float32(s / STEPS))
            losses.append(float(metrics["loss"]))
        out.append((p, np.asarray(losses)))
    return out


def distance(a, b) -> float:
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(x - y)) for x, y in
                              zip(jax.tree.leaves(a), jax.tree.leaves(b)))))


def assert_follows(losses, params, solo_losses, solo_params, init):
    """The solo run's tasks and trajectory: its first loss (same tasks, same initial params) to
    float32 rounding, later losses to the rounding that Adam's first steps amplify (measured on
    CPU: at most 3e-4 relative after 3 steps), and params 100x closer to the solo run's than
    training moved them."""
    np.testing.assert_allclose(losses[0], solo_losses[0], rtol=1e-5)
    np.testing.assert_allclose(losses, solo_losses, rtol=2e-3)
    assert distance(params, solo_params) < 0.01 * distance(solo_params, init)


def test_a_pack_of_three_seeds_trains_each_as_it_trains_alone(built):
    learner, split, optimizer, params = built
    alone = solo(learner, split, optimizer, params)
    packed = steps.make_steps(learner, optimizer, CONFIG.meta_batch, steps=2, runs=True)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *params)
    opt_state = jax.vmap(optimizer.init)(stacked)
    keys = jnp.stack([seeding.purpose_key(seed, "train") for seed in SEEDS])
    losses = []
    for first in range(0, STEPS, 2):
        stacked, opt_state, metrics = packed(stacked, opt_state, split, keys, first,
                                             progress(first, 2))
        losses.append(np.asarray(metrics["loss"]))
    losses = np.concatenate(losses, axis=1)  # [K, STEPS]
    for k, (p, solo_losses) in enumerate(alone):
        assert_follows(losses[k], jax.tree.map(lambda x: x[k], stacked), solo_losses, p,
                       params[k])
    assert not np.allclose(losses[0], losses[1], rtol=1e-2)  # each seed its own tasks


def test_steps_per_dispatch_scan_the_one_step_loop(built):
    learner, split, optimizer, params = built
    (p_alone, losses_alone), *_ = solo(learner, split, optimizer, params[:1])
    multi = steps.make_steps(learner, optimizer, CONFIG.meta_batch, steps=STEPS)
    p, _, metrics = multi(params[0], optimizer.init(params[0]), split,
                          seeding.purpose_key(SEEDS[0], "train"), 0, progress(0, STEPS))
    assert_follows(np.asarray(metrics["loss"]), p, losses_alone, p_alone, params[0])


PACKED = TrainConfig(**{**CONFIG.to_json(), "epochs": 2, "iters_per_epoch": 4, "log_every": 2,
                        "checkpoint_every": 2})
PACK_SEEDS = (0, 1)


@pytest.fixture(scope="module")
def uninterrupted_pack(tmp_path_factory):
    """(results, workdirs) of PACKED's pack of seeds 0 and 1, never stopped: the numbers the
    solo runs and every stopped-and-resumed pack (in this process or a command's) must give."""
    dirs = [str(tmp_path_factory.mktemp("pack") / f"seed{s}") for s in PACK_SEEDS]
    return packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2), dirs


def test_a_packed_run_is_an_ordinary_run_with_the_solo_runs_tasks_and_numbers(
        uninterrupted_pack, tmp_path):
    seeds = PACK_SEEDS
    packed, dirs = uninterrupted_pack
    for seed, out, workdir in zip(seeds, packed, dirs):
        alone = train.train_and_evaluate(dataclasses.replace(PACKED, seed=seed),
                                         str(tmp_path / f"solo{seed}"))
        assert out["task_fingerprint"] == alone["task_fingerprint"]
        mine, solo_test = out["test"], alone["test"]
        print(f"seed {seed}: packed acc {mine['acc_mean']!r} ce {mine['ce_mean']!r}, solo acc "
              f"{solo_test['acc_mean']!r} ce {solo_test['ce_mean']!r}")
        assert abs(mine["acc_mean"] - solo_test["acc_mean"]) <= 0.02
        assert mine["ce_mean"] == pytest.approx(solo_test["ce_mean"], rel=1e-2)
        assert {"checkpoints", "config.json", "results.json", "val_history.json",
                "metrics.jsonl"} <= set(os.listdir(workdir))
        # its wall time counts the pack's training (a session) and its own test (another)
        with open(os.path.join(workdir, "sessions.json")) as f:
            sessions = json.load(f)
        assert sessions["sessions"] == 2 and out["wall_seconds"] < sessions["seconds"]
        # it says that a pack computed its steps (its numbers are the pack's, not the solo's)
        pack = {"seeds": list(seeds), "learning_rates": [PACKED.learning_rate] * len(seeds),
                "axis": steps.resolve_pack_axis("auto"), "steps_per_dispatch": 2}
        assert out["packs"] == [{"phase": "train", "from_step": 0, "pack": pack}]
        assert "packs.json" in checksums.recorded(workdir)  # its bytes are checked when read
        assert "packs" not in alone and not os.path.exists(tmp_path / f"solo{seed}/packs.json")
    assert packed[0]["test"]["ce_mean"] != packed[1]["test"]["ce_mean"]
    assert verify(dirs[1]) == []  # launch.verify's MATCH: the re-test is bit-equal
    assert packs_note(packed[1]).startswith("a pack computed its train steps from 0 (seeds 0,1, ")
    assert packs_note(alone) is None  # the solo run
    assert "bit-equal (tolerance 0" in match_detail(metrics=True)
    # a pack stopped after step 2, resumed, ends where the uninterrupted pack ends, bit for bit
    again = [str(tmp_path / f"again/seed{s}") for s in seeds]
    with pytest.raises(loop.Interrupted):
        packing.train_pack(PACKED, seeds, again, steps_per_dispatch=2, stop_after_steps=2)
    resumed = packing.train_pack(PACKED, seeds, again, steps_per_dispatch=2)
    for out, back in zip(packed, resumed):
        assert (out["test"]["acc_mean"], out["test"]["ce_mean"]) == (
            back["test"]["acc_mean"], back["test"]["ce_mean"])
        assert [(e["from_step"], e["pack"]["seeds"]) for e in back["packs"]] == [
            (0, list(seeds)), (2, list(seeds))]
    # a packed run stopped, then trained on alone: its record says from which step it was alone
    mixed = [str(tmp_path / f"mixed/seed{s}") for s in seeds]
    with pytest.raises(loop.Interrupted):
        packing.train_pack(PACKED, seeds, mixed, steps_per_dispatch=2, stop_after_steps=2)
    alone = train.train_and_evaluate(dataclasses.replace(PACKED, seed=seeds[0]), mixed[0])
    assert [(e["from_step"], e["pack"] and e["pack"]["seeds"]) for e in alone["packs"]] == [
        (0, list(seeds)), (2, None)]
    assert "its train steps 0 to 2 (seeds 0,1, " in packs_note(alone)


def test_a_pack_whose_newest_checkpoint_of_one_run_is_damaged_resumes_each_run_exactly(
        uninterrupted_pack, tmp_path, capsys):
    """Seed 0's step-4 checkpoint garbled: it resumes from step 2, and seed 1, which keeps its
    step-2 checkpoint, goes back to step 2 with it: the pack trains on as one and both end on
    the uninterrupted pack's numbers, bit for bit (they were split into two groups, each run
    alone, and ended on them only up to the rounding of a lone run's program)."""
    packed, _ = uninterrupted_pack
    dirs = [str(tmp_path / f"seed{s}") for s in PACK_SEEDS]
    with pytest.raises(loop.Interrupted):
        packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2, stop_after_steps=4)
    step4 = os.path.join(dirs[0], "checkpoints", "latest", "4")
    largest = max((os.path.join(root, name) for root, _, names in os.walk(step4)
                   for name in names), key=os.path.getsize)
    data = open(largest, "rb").read()
    open(largest, "wb").write(data[:16] + bytes(64) + data[80:])
    resumed = packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2)
    said = capsys.readouterr().out
    assert ("stand at steps [2, 4] (a kill between their checkpoints, or a damaged newest "
            "one): each resumes from step 2, as one pack") in said
    for out, back in zip(packed, resumed):
        assert [(e["from_step"], e["pack"] and e["pack"]["seeds"]) for e in back["packs"]] == [
            (0, list(PACK_SEEDS)), (2, list(PACK_SEEDS))]
        for name in ("acc_mean", "acc_std", "ce_mean", "ce_std"):
            assert back["test"][name] == out["test"][name], name
        assert out["task_fingerprint"] == back["task_fingerprint"]


def test_a_pack_killed_between_its_runs_checkpoints_resumes_as_one_pack(uninterrupted_pack,
                                                                       tmp_path, capsys):
    """A SIGKILL after seed 0's step-2 checkpoint and before seed 1's (the runs of a pack are
    checkpointed one after the other) leaves seed 0 at step 2 and seed 1 at none: both resume
    from step 0 as one pack and end on the uninterrupted pack's numbers, bit for bit. Seed 1
    was trained alone from step 0 and seed 0 alone from step 2: other numbers (a pack's are a
    lone run's only up to the rounding of batched kernels)."""
    import shutil
    packed, _ = uninterrupted_pack
    dirs = [str(tmp_path / f"seed{s}") for s in PACK_SEEDS]
    with pytest.raises(loop.Interrupted):
        packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2, stop_after_steps=2)
    shutil.rmtree(os.path.join(dirs[1], "checkpoints", "latest", "2"))  # as the kill left it
    resumed = packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2)
    for out, back in zip(packed, resumed):
        for name in ("acc_mean", "acc_std", "ce_mean", "ce_std"):
            assert back["test"][name] == out["test"][name], name
        assert back["best_epochs"] == out["best_epochs"]
    assert "stand at steps [0, 2] (a kill" in capsys.readouterr().out


def test_a_pack_resumed_at_a_step_its_steps_per_call_do_not_divide_reaches_every_epoch_end(
        uninterrupted_pack, tmp_path, capsys, monkeypatch):
    """A SIGTERM at step 3 of a pack at one step per call, then the pack resumed with
    --steps_per_dispatch=2: it trains on at one step per call (said, and in packs.json), so
    every epoch end is validated and checkpointed (at two per call from step 3 the steps would
    be 5, 7, 9: no epoch end, an ensemble missing its first epoch), and the runs end on the
    uninterrupted pack's epochs and, to the rounding of another program, its numbers."""
    import signal
    packed, _ = uninterrupted_pack
    dirs = [str(tmp_path / f"seed{s}") for s in PACK_SEEDS]

    def signal_at(self, state):  # a real SIGTERM to this process once step 3 is reached
        if state.step == self.steps:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(loop.StopAfter, "after_step", signal_at)
        with pytest.raises(loop.Stopped):
            packing.train_pack(PACKED, PACK_SEEDS, dirs, stop_after_steps=3)
    with pytest.raises(ValueError, match="stop_after_steps=3 is not a multiple of "):
        packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2, stop_after_steps=3)
    resumed = packing.train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2)
    assert ("[train] training resumes from step 3, which --steps_per_dispatch=2 does not "
            "divide: 1 step(s) per call") in capsys.readouterr().out
    for out, back, workdir in zip(packed, resumed, dirs):
        assert [(e["from_step"], e["pack"]["steps_per_dispatch"]) for e in back["packs"]] == [
            (0, 1), (3, 1)]
        assert [e["epoch"] for e in results.read_json(os.path.join(workdir, "val_history.json"))
                ] == [0, 1]
        assert sorted(back["best_epochs"]) == sorted(out["best_epochs"]) == [0, 1]
        assert abs(out["test"]["acc_mean"] - back["test"]["acc_mean"]) <= 0.02
        assert back["test"]["ce_mean"] == pytest.approx(out["test"]["ce_mean"], rel=1e-2)
    with pytest.raises(ValueError, match="use loop.aligned"):  # the loop itself refuses it
        loop.run_hooks(loop.phase(PACKED, "train", "meta-training", None, 2),
                       loop.TrainState(None, None, step=3), None, [], None)


def test_a_pack_with_a_run_another_process_trains_is_refused_before_writing(tmp_path):
    dirs = [str(tmp_path / f"seed{s}") for s in PACK_SEEDS]
    os.makedirs(dirs[1])
    code = ("import time; from cfsl_jax.runtime import locks\n"
            f"with locks.held({locks.path_in(dirs[1])!r}, 'x'):\n"
            "    print('held', flush=True); time.sleep(600)")
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        with pytest.raises(locks.Busy, match=f"workdir {re.escape(dirs[1])} is in use by host "
                           f".* pid {other.pid} since "):
            packing.meta_train_pack(PACKED, PACK_SEEDS, dirs, steps_per_dispatch=2)
        assert os.listdir(dirs[1]) == [".lock"]  # nothing written into either run
        assert not os.path.exists(os.path.join(dirs[0], "config.json"))
    finally:
        other.kill()


def test_repeated_or_missing_seeds_are_refused():
    with pytest.raises(UserError, match=r"--seeds=0,1,0: seed 0 is given twice"):
        packing.check_seeds((0, 1, 0))
    with pytest.raises(UserError, match=r"--seeds=: no seed"):
        packing.check_seeds(())
    with pytest.raises(UserError, match=r"--seeds=0,-2: seed -2 is negative"):
        packing.check_seeds((0, -2))
    # --eval_seed=seed: each seed its own validation and test tasks, which a pack cannot share
    # (it tested seed 1 on seed 0's tasks before this refusal)
    with pytest.raises(UserError, match=r"--eval_seed=seed with --seeds=0,1: a pack validates "
                       r"and tests its runs on the same tasks"):
        packing.pack_configs(dataclasses.replace(PACKED, eval_seed=None), (0, 1))
    assert len(packing.pack_configs(dataclasses.replace(PACKED, eval_seed=None), (3, 3),
                                    learning_rates=(1e-3, 2e-3))) == 2  # one seed: its tasks
    packing.check_steps_per_dispatch(PACKED, 2)  # divides 4, 2 and 2
    packing.check_steps_per_dispatch(dataclasses.replace(PACKED, checkpoint_every=0), 2)
    with pytest.raises(UserError, match=r"--steps_per_dispatch=4 must divide .* \(now 4, 2, 2"):
        packing.check_steps_per_dispatch(PACKED, 4)


def test_a_sweep_packs_the_runs_that_differ_only_in_their_seeds():
    from cfsl_jax.experiments import sweep, sweep_plan
    configs = [dataclasses.replace(CONFIG, seed=s, task=t) for t in ("B2", "B3") for s in range(5)]
    runs_ = [sweep.Run(c, f"w/{c.task}/seed{c.seed}") for c in configs]
    groups = [[run.workdir for run in group] for group in sweep.packs(runs_, 3)]
    assert groups == [["w/B2/seed0", "w/B2/seed1", "w/B2/seed2"], ["w/B2/seed3", "w/B2/seed4"],
                      ["w/B3/seed0", "w/B3/seed1", "w/B3/seed2"], ["w/B3/seed3", "w/B3/seed4"]]
    # a learning rate is packable (traced per run), a meta-batch is not (another program)
    mixed = [dataclasses.replace(CONFIG, learning_rate=1e-3), dataclasses.replace(
        CONFIG, learning_rate=2e-3), dataclasses.replace(CONFIG, meta_batch=4)]
    assert [len(group) for group in sweep_plan.pack_groups(mixed, 3)] == [2, 1]
    # with --eval_seed=seed every seed has its own evaluation tasks: no two of them pack
    own = [dataclasses.replace(CONFIG, seed=s, eval_seed=None) for s in range(3)]
    assert [len(group) for group in sweep_plan.pack_groups(own, 3)] == [1, 1, 1]
    assert [len(g) for g in sweep.packs(runs_, 1)] == [1] * 10


def test_a_shard_and_a_slurm_array_task_hold_whole_packs(tmp_path):
    import subprocess
    import sys
    from cfsl_jax.experiments import sweep_plan
    from test_cli import assert_error, run_cases
    from test_slurm import TINY_FLAGS, _fake_slurm_bin
    configs = [dataclasses.replace(CONFIG, seed=s, task=t) for s in range(3)
               for t in ("B2", "B3", "C2")]  # seed-major, as sweep_plan.grid orders them
    shards = [sweep_plan.shard(configs, k, 2, pack=3) for k in (1, 2)]
    assert [[(c.task, c.seed) for c in shard] for shard in shards] == [
        [("B2", 0), ("B2", 1), ("B2", 2), ("C2", 0), ("C2", 1), ("C2", 2)],
        [("B3", 0), ("B3", 1), ("B3", 2)]]
    assert sweep_plan.shard(configs, 1, 2) == configs[0::2]  # without packs: run by run
    base = [f"--workdir={tmp_path / 'sweep'}", "--cells=B2,B3,C2", "--seeds=0,1,2", *TINY_FLAGS,
            "--dataset_option=num_classes=100"]  # B3's 9 validation classes
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    listed = subprocess.run([sys.executable, "-m", "launch.sweep", *base, "--dry_run",
                             "--pack=auto", "--shard=2/2"], cwd=repo, capture_output=True,
                            text=True)
    assert listed.returncode == 0, listed.stderr
    packs_ = [line.split()[3:] for line in listed.stdout.splitlines() if line.startswith("pack of")]
    assert [[path.split("/")[-2:] for path in pack] for pack in packs_] == [
        [["B3", "seed0"], ["B3", "seed1"], ["B3", "seed2"]]]
    assert "--pack=auto: packs of up to 3 runs" in listed.stdout
    # a SLURM array task runs one whole pack: the same packs at every submission (done runs count)
    from cfsl_jax.experiments import slurm
    works = slurm.sweep_work(configs, str(tmp_path / "s"), pack=3)
    assert [len(work.args[1]) for work in works] == [3, 3, 3]
    assert [[c["task"] for c in work.args[0]] for work in works] == [["B2"] * 3, ["B3"] * 3,
                                                                      ["C2"] * 3]
    assert works[0].key == "+".join(os.path.relpath(w, tmp_path / "s") for w in works[0].args[1])
    assert {work.status() for work in works} == {"todo"}
    assert len(slurm.sweep_work(configs, str(tmp_path / "s"))) == 9  # --pack=1: run by run
    path = f"{_fake_slurm_bin(tmp_path)}:{os.environ['PATH']}"
    zero, = run_cases("sweep", [[*base, "--pack=0"]], env={"PATH": path})
    assert_error(zero, "--pack=0: give an integer >= 1 or auto")


PACK_FLAGS = ["--learner=protonets", "--learner_option=filters=8", "--dataset=synthetic",
              "--dataset_option=num_classes=60", "--dataset_option=samples_per_class=8",
              "--task=B2", "--nc=3", "--kt=2", "--epochs=2", "--iters_per_epoch=4",
              "--meta_batch=2", "--val_tasks=6", "--test_tasks=7", "--eval_batch=4",
              "--keep_best=2", "--log_every=2", "--checkpoint_every=2", "--seeds=0,1",
              "--steps_per_dispatch=2"]


def start_pack(workdir: str):
    """``launch.train`` of PACKED's pack of seeds 0 and 1 in ``workdir``, a subprocess at -O0
    and the suite's precision (the uninterrupted pack's settings), output merged and piped."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cache = jax.config.values["jax_compilation_cache_dir"]  # the programs this process compiled
    return subprocess.Popen([sys.executable, "-m", "launch.train", f"--workdir={workdir}",
                             f"--precision={TEST_PRECISION}", f"--compilation_cache_dir={cache}",
                             *PACK_FLAGS], cwd=repo, env=unoptimised_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_pack(workdir: str, signum: int, nth: int) -> tuple[int, str]:
    """``start_pack`` with ``signum`` sent at its ``nth`` meta-training progress line (a real
    signal, at a moment of the command's own timing): (exit status, output)."""
    import signal
    process, lines, seen = start_pack(workdir), [], 0
    for line in process.stdout:
        lines.append(line)
        if re.match(r"\[train\] [1-9]\d*/\d+ steps \(", line):
            seen += 1
            if seen == nth:
                process.send_signal(signum)
                if signum == signal.SIGKILL:
                    break
    return process.wait(), "".join(lines)


@pytest.mark.slow  # three launch.train commands
def test_a_pack_stopped_by_sigterm_or_killed_resumes_exactly(uninterrupted_pack, tmp_path):
    """SIGTERM at a random progress line of the pack's meta-training, then SIGKILL at another
    of its resumption: the pack, resumed again, ends with the uninterrupted pack's numbers
    for every run, bit for bit (the commands compile at -O0, as the uninterrupted pack did in
    this process: a stop's exactness does not depend on the level)."""
    import random
    import signal
    rng = random.Random(28)
    stopped = str(tmp_path / "stopped")
    code, output = stop_pack(stopped, signal.SIGTERM, rng.randint(1, 2))
    assert code == 128 + signal.SIGTERM, output[-2000:]
    assert "re-run the same command to resume" in output, output[-2000:]
    code, output = stop_pack(stopped, signal.SIGKILL, rng.randint(1, 2))
    assert code == -signal.SIGKILL, output[-2000:]
    resumed = start_pack(stopped)
    output = resumed.communicate()[0]
    assert resumed.returncode == 0, output[-2000:]
    for seed, full in zip(PACK_SEEDS, uninterrupted_pack[1]):
        resumed, alone = (results.read_json(os.path.join(w, "results.json"))
                          for w in (os.path.join(stopped, f"seed{seed}"), full))
        assert resumed["task_fingerprint"] == alone["task_fingerprint"]
        assert {k: resumed["test"][k] for k in ("acc_mean", "acc_std", "ce_mean", "ce_std")} == {
            k: alone["test"][k] for k in ("acc_mean", "acc_std", "ce_mean", "ce_std")}


def test_a_pack_that_does_not_fit_names_the_largest_that_does(monkeypatch):
    from types import SimpleNamespace
    from cfsl_jax.runtime import memory
    analysis = SimpleNamespace(temp_size_in_bytes=9 * memory.GIB, output_size_in_bytes=0,
                               alias_size_in_bytes=0, argument_size_in_bytes=3 * memory.GIB)
    compiled = SimpleNamespace(memory_analysis=lambda: analysis)  # 4 GiB a run
    monkeypatch.setattr(memory, "device_limit", lambda device: (10 * memory.GIB, True))
    with pytest.raises(UserError, match=r"a pack of 3 protonets runs needs 12.0 GiB .* more "
                                        r"than the 10.0 GiB .*--pack=3 is too many: at most "
                                        r"--pack=2 fits"):
        packing.check_pack_fits(compiled, 3, "protonets")
    monkeypatch.setattr(memory, "device_limit", lambda device: (12 * memory.GIB, True))
    packing.check_pack_fits(compiled, 3, "protonets")  # fits exactly
    assert packing.largest_fitting(12 * memory.GIB, 3 * memory.GIB, 3) == 0


PRETRAIN = TrainConfig(
    learner="pretrain_tune", learner_options={"filters": 8, "inner_steps": 2},
    dataset="synthetic", dataset_options={"num_classes": 60, "samples_per_class": 8},
    task="B2", spec_overrides={"nc": 3, "kt": 2}, epochs=2, iters_per_epoch=2, meta_batch=2,
    val_tasks=4, test_tasks=5, eval_batch=5, keep_best=1, log_every=1, checkpoint_every=1)


def pretrain_losses(workdir: str) -> list[float]:
    import json
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [row["loss"] for row in rows if row["phase"] == "pretrain"]  # log_every=1: each step


class SoloRuns:
    """``solo(config)``: (its results, its workdir), trained alone on first use (the module's
    tests share a solo run of the same config)."""

    def __init__(self, root):
        self.root, self.trained = root, {}

    def __call__(self, config):
        key = json.dumps(config.to_json(), sort_keys=True)
        if key not in self.trained:
            workdir = str(self.root / f"solo{len(self.trained)}")
            self.trained[key] = train.train_and_evaluate(config, workdir), workdir
        return self.trained[key]


@pytest.fixture(scope="module")
def solo_runs(tmp_path_factory):
    return SoloRuns(tmp_path_factory.mktemp("solo"))


@pytest.mark.parametrize("seeds, rates", [((0, 1), None), ((0, 0), (1e-3, 4e-3))])
def test_pretraining_on_tasks_packs_as_meta_training_does(tmp_path, capsys, solo_runs, seeds,
                                                          rates):
    """Pretrain+Tune's pretraining of two seeds (or one seed at two learning rates) as one
    program: each run's losses follow its solo run's (the same tasks from the same head), the
    same test tasks, its numbers to the rounding of batched kernels."""
    dirs = [str(tmp_path / f"pack/run{k}") for k in range(len(seeds))]
    packed = packing.train_pack(PRETRAIN, seeds, dirs, learning_rates=rates)
    assert "[pretrain] compiling a pack of 2 pretrain_tune pretraining runs" in (
        capsys.readouterr().out)  # one program, not each run alone
    configs = packing.pack_configs(PRETRAIN, seeds, rates)
    for config, out, workdir in zip(configs, packed, dirs):
        alone, alone_dir = solo_runs(config)
        assert out["task_fingerprint"] == alone["task_fingerprint"]
        mine, theirs = pretrain_losses(workdir), pretrain_losses(alone_dir)
        assert len(mine) == len(theirs) == 4
        np.testing.assert_allclose(mine[0], theirs[0], rtol=1e-5)  # step 0: same tasks, head
        np.testing.assert_allclose(mine, theirs, rtol=2e-3)
        assert abs(out["test"]["acc_mean"] - alone["test"]["acc_mean"]) <= 0.03
        assert out["test"]["ce_mean"] == pytest.approx(alone["test"]["ce_mean"], rel=2e-2)
        assert out["packs"][0]["pack"]["axis"] == steps.resolve_pack_axis("auto")
    assert pretrain_losses(dirs[0]) != pretrain_losses(dirs[1])  # its own seed or rate
    # a stopped pretraining pack resumes bit for bit: tests/test_pack_eval.py, with SIGTERM


RATES = (1e-3, 2e-3, 4e-3)


@pytest.fixture(scope="module")
def solo_at_rates(built):
    """The first seed alone at each of RATES, S steps per call: (its optimiser state, params,
    losses) per rate, shared by both pack axes."""
    learner, split, _, params = built
    key, out = seeding.purpose_key(SEEDS[0], "train"), []
    for rate in RATES:
        own = train.make_optimizer(dataclasses.replace(CONFIG, learning_rate=rate))
        alone = steps.make_steps(learner, own, CONFIG.meta_batch, steps=STEPS)
        p, state, metrics = alone(params[0], own.init(params[0]), split, key, 0,
                                  progress(0, STEPS))
        out.append((state, p, np.asarray(metrics["loss"])))
    return out


@pytest.mark.parametrize("pack_axis", ["map", "vmap"])
def test_runs_at_different_learning_rates_share_one_program(built, solo_at_rates, pack_axis):
    """One seed at three learning rates as one pack (``per_run``: each run's rate traced): each
    run follows the run alone at its rate (its tasks and trajectory, to the rounding of a
    differently compiled program), its optimiser state has the solo run's layout (its
    checkpoints are the solo run's), and the rates do differ."""
    learner, split, _, params = built
    configs = [dataclasses.replace(CONFIG, learning_rate=rate) for rate in RATES]
    optimizer = train.make_optimizer(configs[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[0]] * len(RATES))
    keys = jnp.stack([seeding.purpose_key(SEEDS[0], "train")] * len(RATES))
    packed = steps.make_steps(learner, optimizer, CONFIG.meta_batch, steps=STEPS, runs=True,
                              pack_axis=pack_axis, per_run=train.pack_optimizer)
    out, opt_state, metrics = packed(stacked, jax.vmap(optimizer.init)(stacked), split, keys,
                                     0, progress(0, STEPS), packing.hyper_parameters(configs))
    for k, (state, p, solo_losses) in enumerate(solo_at_rates):
        assert jax.tree.structure(state) == jax.tree.structure(
            jax.tree.map(lambda x: x[k], opt_state))
        assert_follows(np.asarray(metrics["loss"][k]), jax.tree.map(lambda x: x[k], out),
                       solo_losses, p, params[0])
    finals = [p for _, p, _ in solo_at_rates]
    assert np.all(np.asarray(metrics["loss"])[:, 0] == metrics["loss"][0, 0])  # same tasks
    # each run at its own rate: the rates set the runs apart far beyond the pack's rounding
    assert distance(finals[0], finals[2]) > 10 * distance(jax.tree.map(lambda x: x[0], out),
                                                          finals[0])
    assert packing.hyper_parameters(configs[:1] * 3) is None  # a pack of seeds: constants


def test_a_learning_rate_pack_from_the_command_line(tmp_path):
    """``launch.train --learning_rates=A,B --seeds=0,1``: four ordinary runs in WORKDIR/lrR/seedS
    as one pack, each with its own rate in config.json and its pack (seeds and rates) in
    packs.json, each at the solo run's test numbers; a mistake in the list is one line."""
    from launch_inprocess import command_module, run_in_process
    from test_cli import assert_error, run_cases
    flags_ = ["--dataset=synthetic", "--dataset_option=num_classes=60",
              "--dataset_option=samples_per_class=8", "--task=B2", "--nc=3", "--kt=2",
              "--learner=protonets", "--learner_option=filters=8", "--epochs=1",
              "--iters_per_epoch=4", "--meta_batch=2", "--val_tasks=4", "--test_tasks=5",
              "--eval_batch=4", "--keep_best=1", "--log_every=2"]
    with command_module("train") as module:
        code, _, err = run_in_process(module, "train", [
            f"--workdir={tmp_path / 'w'}", *flags_, "--learning_rates=0.001,0.004",
            "--seeds=0,1", "--steps_per_dispatch=2"])
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "w")) == ["flags.txt", "lr0.001", "lr0.004"]
    tests = {}
    for rate in ("0.001", "0.004"):
        for seed in (0, 1):
            workdir = tmp_path / "w" / f"lr{rate}" / f"seed{seed}"
            out = results.read_json(str(workdir / "results.json"))
            assert (out["config"]["learning_rate"], out["seed"]) == (float(rate), seed)
            assert out["packs"][0]["pack"]["seeds"] == [0, 1, 0, 1]
            assert out["packs"][0]["pack"]["learning_rates"] == [0.001, 0.001, 0.004, 0.004]
            tests[rate, seed] = out["test"]
    assert packs_note(out).startswith("a pack computed its train steps from 0 (seeds 0,1,0,1 "
                                      "at learning rates 0.001,0.001,0.004,0.004, ")
    assert verify(str(workdir)) == []  # an ordinary run: its re-test is bit-equal
    config = TrainConfig(**results.read_json(str(tmp_path / "w/lr0.004/seed1/config.json")))
    alone = train.train_and_evaluate(config, str(tmp_path / "solo"))["test"]
    mine = tests["0.004", 1]
    assert abs(mine["acc_mean"] - alone["acc_mean"]) <= 0.02
    assert mine["ce_mean"] == pytest.approx(alone["ce_mean"], rel=1e-2)
    assert tests["0.001", 1]["ce_mean"] != mine["ce_mean"]  # its own rate
    bad = run_cases("train", [
        [f"--workdir={tmp_path / 'x'}", *flags_, f"--learning_rates={rates}"]
        for rates in ("0.001,fast", "0.001,-1", "0.001,1e-3")] + [
        [f"--workdir={tmp_path / 'x'}", *flags_, "--learning_rates=0.001,0.01",
         "--learning_rate=0.1"], [f"--workdir={tmp_path / 'x'}", *flags_, "--seeds=0,1",
                                  "--eval_seed=seed"]])
    assert_error(bad[0], "--learning_rates=0.001,fast: fast is not a positive number")
    assert_error(bad[1], "--learning_rates=0.001,-1: -1 is not a positive number")
    assert_error(bad[2], "--learning_rates=0.001,1e-3: 1e-3 is given twice")
    assert_error(bad[3], "--learning_rates=0.001,0.01 and --learning_rate=0.1: give one of them")
    assert_error(bad[4], "--eval_seed=seed with --seeds=0,1: a pack validates and tests its "
                         "runs on the same tasks")
    sweep, = run_cases("sweep", [[f"--workdir={tmp_path / 'x'}", "--dataset=synthetic",
                                  "--learning_rates=0.001,0.01", "--dry_run"]])
    assert_error(sweep, "--learning_rates=0.001,0.01: launch.train's (a pack of runs at several "
                        "rates); a sweep runs at one --learning_rate")
    assert not os.path.exists(tmp_path / "x")


def test_a_learning_rate_pack_stopped_resumes_to_the_same_numbers(tmp_path):
    """A pack of one seed at two rates stopped after step 2 (each run checkpointed) and resumed
    ends where the uninterrupted pack ends, bit for bit, each run at its own rate."""
    seeds, rates = (0, 0), (1e-3, 4e-3)
    ends = []
    for name, stops in (("whole", False), ("stopped", True)):
        dirs = [str(tmp_path / name / f"lr{rate!r}") for rate in rates]
        if stops:
            with pytest.raises(loop.Interrupted):
                packing.train_pack(PACKED, seeds, dirs, steps_per_dispatch=2,
                                   stop_after_steps=2, learning_rates=rates)
        ends.append([(out["config"]["learning_rate"], out["test"]["acc_mean"],
                      out["test"]["ce_mean"]) for out in packing.train_pack(
                          PACKED, seeds, dirs, steps_per_dispatch=2, learning_rates=rates)])
    assert ends[0] == ends[1]
    assert [rate for rate, *_ in ends[0]] == list(rates) and ends[0][0][2] != ends[0][1][2]
