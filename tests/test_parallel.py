"""Sharding over tasks (8 fake CPU devices, set in conftest), bf16 compute, long tasks."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cfsl_jax import data
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.training import evaluate as evaluation
from cfsl_jax.runtime import parallel
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.spec import TaskSpec
from cfsl_jax.training.train import TrainConfig, make_optimizer, make_train_step

from conftest import FAKE_DEVICES, cpu_mesh, traces_counted

IMAGE = (28, 28, 1)
SUMMARY = ("acc_mean", "acc_std", "ce_mean", "ce_std", "group_acc", "task_fingerprint")


@pytest.fixture(scope="module")
def split():
    return data.load_split("synthetic", "test")


def build(name, spec=TaskSpec.preset("B3"), compute_dtype="float32", image=IMAGE, **options):
    learner = get_learner(name, spec, image_shape=image, compute_dtype=compute_dtype,
                          **options)
    init = jax.jit(learner.init_params, static_argnums=2)  # one program, not op by op
    return learner, init(jax.random.key(0), jnp.zeros((1, *image)), spec)


def test_fake_devices_and_mesh_errors():
    assert len(jax.devices("cpu")) == FAKE_DEVICES
    assert cpu_mesh().size == FAKE_DEVICES
    assert cpu_mesh(3).size == 3
    assert {d.platform for d in cpu_mesh().devices.flat} == {"cpu"}
    with pytest.raises(ValueError, match=r"num_devices=9: .* 8 cpu device\(s\); choose 1..8"):
        cpu_mesh(9)
    with pytest.raises(ValueError, match="num_devices=-1"):
        cpu_mesh(-1)
    assert parallel.padded(13, cpu_mesh()) == 16


def test_global_array_is_task_sharded_and_comes_back_whole():
    mesh = cpu_mesh()
    host = np.arange(16 * 2, dtype=np.uint32).reshape(16, 2)
    array = parallel.global_array(host, mesh)
    assert array.sharding == parallel.task_sharded(mesh)
    assert {shard.data.shape for shard in array.addressable_shards} == {(2, 2)}
    np.testing.assert_array_equal(parallel.to_host(array), host)


@pytest.mark.parametrize("num_tasks", [13, 16])  # not divisible / divisible by 8 devices
def test_protonets_evaluation_on_8_devices_is_bit_identical(split, num_tasks):
    learner, params = build("protonets")
    reports = [evaluation.evaluate(learner, params, split, num_tasks=num_tasks, batch_size=2,
                                   cost_metrics=False, mesh=cpu_mesh(n))
               for n in (1, FAKE_DEVICES)]
    # 1 device runs chunks of 2 tasks, 8 devices one chunk of 16: the padding (1 vs 3
    # extra tasks for 13) differs, so equal means prove the padding was dropped. Each device
    # runs its 2 tasks one at a time (CPU: episode.sequential), as one device does.
    assert [r["num_tasks"] for r in reports] == [num_tasks, num_tasks]
    assert [r["devices"] for r in reports] == [1, FAKE_DEVICES]
    assert [r["tasks_in_turn"] for r in reports] == [True, True]
    for name in SUMMARY:
        assert reports[0][name] == reports[1][name], name


def test_gradient_learner_evaluation_on_8_devices_matches(split):
    # init_tune runs its tasks one at a time per device ([tasks / devices, devices] lanes).
    # The 1- and 8-device programs are partitioned differently, so they agree to float
    # rounding per task, and fine-tuning may amplify that rounding in a task: measured on an
    # AVX-512 AMD EPYC, task 5 of 9 ends at CE 2.156 on 1 device and 2.231 on 8 with the same
    # predictions, while most others agree to 1e-7 (which tasks, and how many, depends on the
    # CPU and XLA's emitters: task 7 too, at 7.7e-4, with the elemental ones). So: the same
    # tasks, the same predictions, most tasks' CE equal to 1e-5 and none more than 5 % apart
    # (a sharding error changes every task).
    learner, params = build("init_tune")
    reports = [evaluation.evaluate(learner, params, split, num_tasks=9, batch_size=2,
                                   cost_metrics=False, mesh=cpu_mesh(n), per_task=True)
               for n in (1, FAKE_DEVICES)]
    assert reports[0]["task_fingerprint"] == reports[1]["task_fingerprint"]
    assert reports[0]["per_task"]["acc"] == pytest.approx(reports[1]["per_task"]["acc"],
                                                          abs=1e-6)
    ce = np.array([r["per_task"]["ce"] for r in reports])
    assert ce.shape == (2, 9) and np.isfinite(ce).all()
    relative = np.abs(ce[0] - ce[1]) / np.abs(ce[0])
    assert np.median(relative) < 1e-5 and relative.max() < 0.05, ce
    assert reports[0]["ce_mean"] == pytest.approx(float(ce[0].mean()), rel=1e-6)


def test_per_task_weight_learners_train_and_evaluate_on_8_devices(split):
    # A per-task-weight learner on CPU walks each device's tasks inside shard_map
    # (parallel.map_tasks); the params and split it needs enter as shard_map inputs. Closed
    # over instead, they kept the mesh's global sharding and an op copying it failed on 8
    # devices: MAML++ L's step at sample_task's gather, EWC-Init's evaluation at
    # zeros_like (launch.train exited 1 for MAML++ L/H, SCA and both EWC learners).
    maml, maml_params = build("maml_low", filters=8, inner_steps=1)
    ewc, ewc_params = build("ewc_init", filters=8)
    optimizer = optax.sgd(0.03)
    results = []
    for n in (1, FAKE_DEVICES):
        mesh = cpu_mesh(n)
        assert episode.sequential(mesh)
        step = make_train_step(maml, optimizer, meta_batch=8, mesh=mesh)
        p, state = parallel.replicate((maml_params, optimizer.init(maml_params)), mesh)
        stepped, _, out = step(p, state, parallel.place_split(split, mesh), jax.random.key(0),
                               jnp.float32(0))
        report = evaluation.evaluate(ewc, ewc_params, split, num_tasks=8, batch_size=8,
                                     cost_metrics=False, mesh=mesh, per_task=True)
        results.append((float(out["loss"]), jax.device_get(stepped), report))
    (loss_one, p_one, one), (loss_eight, p_eight, eight) = results
    assert loss_one == pytest.approx(loss_eight, rel=1e-5)
    # the same update: every leaf agrees to 1% of how far the step moved it
    for start, a, b in zip(jax.tree.leaves(maml_params), jax.tree.leaves(p_one),
                           jax.tree.leaves(p_eight)):
        assert np.abs(a - b).max() <= 0.01 * np.abs(a - start).max() + 1e-7
    assert max(float(np.abs(a - s).max()) for s, a in zip(jax.tree.leaves(maml_params),
                                                          jax.tree.leaves(p_one))) > 1e-4
    assert one["task_fingerprint"] == eight["task_fingerprint"]
    assert one["per_task"]["acc"] == pytest.approx(eight["per_task"]["acc"], abs=1e-6)


def test_meta_training_on_8_devices_matches_one_and_compiles_once(split):
    # Plain SGD: Adam would turn the float-noise gradients of the conv biases (which
    # BatchStatNorm cancels: true gradient 0) into full +-lr steps of either sign.
    # One step is compared: batch statistics over 5-image support sets amplify float
    # summation-order differences from step to step (measured on CPU, jax 0.10.2: loss rel.
    # difference 3.5e-7 at step 0, 7e-7 after one step, 3e-5 after two on an Intel Xeon; on an
    # AMD EPYC 3e-7 at step 0 and 6.2e-5 after one step, while every parameter leaf agrees to
    # 0.2 % of its move), so a longer run would compare that amplification, not the sharding;
    # the loss after the update is held to 2e-4.
    learner, params = build("protonets", filters=16)  # 16: the sharding, not the width, is tested
    optimizer = optax.sgd(0.03)
    finals = []
    for n in (1, FAKE_DEVICES):
        mesh = cpu_mesh(n)
        step = make_train_step(learner, optimizer, meta_batch=6, mesh=mesh)  # 6: 2 padded on 8
        p, state = parallel.replicate((params, optimizer.init(params)), mesh)
        placed = parallel.place_split(split, mesh)
        p, state, out = step(p, state, placed, jax.random.key(0), jnp.float32(0))
        one_step, key = p, jax.random.key(1)
        with traces_counted() as traced:  # the second step reuses the first one's program
            _, _, again = step(p, state, placed, key, jnp.float32(0))
        assert traced == [0]
        finals.append((one_step, float(out["loss"]), float(again["loss"])))
    assert finals[0][1] == pytest.approx(finals[1][1], rel=1e-5)  # same params: the forward
    assert finals[0][2] == pytest.approx(finals[1][2], rel=2e-4)  # after one sharded update
    finals = jax.device_get(finals)
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), finals[0][0], params)
    differ = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), finals[0][0], finals[1][0])
    assert max(jax.tree.leaves(moved)) > 1e-3  # the step did change the parameters
    # float summation order only: every leaf agrees to 1% of how far the step moved it
    for move, diff in zip(jax.tree.leaves(moved), jax.tree.leaves(differ)):
        assert diff <= 0.01 * move + 1e-7, (move, diff)


class _Device:  # what fits_one_device reads of a device: its memory statistics
    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return None if self.limit is None else {"bytes_limit": self.limit}


def test_a_split_is_sharded_only_when_it_does_not_fit_one_device(split):
    assert parallel.fits_one_device(10**12, _Device(None))  # CPU: no limit reported
    assert parallel.fits_one_device(25, _Device(100))
    assert not parallel.fits_one_device(26, _Device(100))
    assert parallel.fits_one_device(split.images.nbytes, jax.devices("cpu")[0])
    placed = parallel.place_split(split, cpu_mesh())  # CPU: replicated
    assert not parallel.is_sharded(placed.images)


def test_sharded_split_gives_the_same_evaluation(split):
    learner, params = build("protonets")
    mesh = cpu_mesh()
    sharded = parallel.place_split(split, mesh, shard=True)
    assert parallel.is_sharded(sharded.images)
    reports = [evaluation.evaluate(learner, params, s, num_tasks=8, batch_size=1,
                                   cost_metrics=False, mesh=mesh) for s in (split, sharded)]
    for name in SUMMARY:
        assert reports[0][name] == reports[1][name], name


def test_bfloat16_halves_a_float_state_and_keeps_protonets_accuracy(split):
    mesh = cpu_mesh(1)
    # at a fresh init, batch norm on each set's own statistics (running averages start at
    # mean 0, variance 1: unnormalised features that rounding, not the state's dtype, decides)
    f32, params = build("protonets", bn_stats="batch")
    bf16, _ = build("protonets", compute_dtype="bfloat16", bn_stats="batch")
    reports = [evaluation.evaluate(learner, params, split, num_tasks=40, batch_size=20,
                                   cost_metrics=False, mesh=mesh) for learner in (f32, bf16)]
    assert reports[1]["acc_mean"] == pytest.approx(reports[0]["acc_mean"], abs=0.02)
    state = metrics.state_shapes(bf16, params, IMAGE)
    assert state.sums.dtype == jnp.bfloat16 and state.counts.dtype == jnp.int32
    # init_tune carries only float weights: its ATM halves exactly
    tune32, tune_params = build("init_tune")
    tune16, _ = build("init_tune", compute_dtype="bfloat16")
    assert metrics.atm(tune16, tune_params, IMAGE) == metrics.atm(tune32, tune_params, IMAGE) / 2
    with pytest.raises(ValueError, match=r"compute_dtype='float8'; valid"):
        build("protonets", compute_dtype="float8")


def test_bfloat16_training_keeps_float32_params_and_optimizer_state(split):
    learner, params = build("protonets", compute_dtype="bfloat16")
    optimizer = make_optimizer(TrainConfig())
    step = make_train_step(learner, optimizer, meta_batch=2)
    new, state, out = step(params, optimizer.init(params), split, jax.random.key(0),
                           jnp.float32(0))
    assert np.isfinite(float(out["loss"]))
    assert {str(leaf.dtype) for leaf in jax.tree.leaves((new, state))} == {"float32", "int32"}


@pytest.mark.parametrize("size,chunk", [(16000, 1000), (1001, 1000), (2500, 1000), (7, 3)])
def test_target_chunks_cover_the_target_set_once_interleaved(size, chunk):
    groups = episode.target_chunks(size, chunk)
    flat = np.concatenate([g.reshape(-1) for g in groups])
    np.testing.assert_array_equal(np.sort(flat), np.arange(size))
    lengths = {g.shape[1] for g in groups}
    assert max(lengths) <= chunk and max(lengths) - min(lengths) <= 1
    count = sum(g.shape[0] for g in groups)
    assert count == -(-size // chunk)
    for g in groups:  # chunk k holds k, k + count, k + 2 count, ...
        np.testing.assert_array_equal(np.diff(g, axis=1), count)


def test_long_target_set_is_predicted_chunk_by_chunk(split):
    spec = TaskSpec.preset("B3")
    learner, params = build("protonets", spec)
    support_x = jax.random.uniform(jax.random.key(1), (spec.nss, spec.support_size, *IMAGE))
    support_y = jnp.tile(jnp.arange(spec.support_size), (spec.nss, 1)) + 5 * jnp.arange(3)[:, None]
    target_x = jax.random.uniform(jax.random.key(2), (7, *IMAGE))
    state = episode.adapt_all(learner, params, support_x, support_y, jax.random.key(0))
    chunked = episode.predict_target(learner, params, state, target_x, chunk=3)
    for group in episode.target_chunks(7, 3):
        for idx in group:  # every chunk is predicted as a batch of its own
            np.testing.assert_allclose(chunked[idx], learner.predict(params, state, target_x[idx]),
                                       rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def many_classes():
    """Enough classes for a type-C task at NSS=640 (3,200 train classes); small 16x16 images."""
    return data.load_split("synthetic", "train", num_classes=4400, samples_per_class=6,
                           image_size=16)


@pytest.mark.parametrize("name", ["init_tune", "maml_low"])
def test_nss_640_evaluation_completes_in_bounded_memory(many_classes, name, monkeypatch):
    spec = TaskSpec.parse("C640")  # 640 support sets of 5, a target set of 16,000 images
    image = tuple(many_classes.images.shape[1:])
    mesh = cpu_mesh(1)
    # Keys, params and split placed as evaluate() places them: evaluate() then loads the
    # chunked program temp_bytes compiled from the persistent compilation cache.
    keys = parallel.global_array(jax.random.key_data(jax.random.split(jax.random.key(0), 1)),
                                 mesh)
    split = parallel.place_split(many_classes, mesh)

    def temp_bytes(learner, params):  # XLA's temporary buffers of the evaluation program
        compiled = evaluation._evaluate_chunk.lower(
            learner, parallel.replicate(params, mesh), split, keys, False, mesh).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    # 64 filters: the same memory pattern, 3x the seconds; 5 inner steps (the default): the
    # same pattern, 1.7x the seconds (measured 177 s instead of 105 s for both learners).
    narrow = {"filters": 16, "inner_steps": 2}
    # TARGET_CHUNK is read when the program is traced, and a learner of the same settings is
    # the same object (get_learner): drop the traced programs whenever it changes.
    monkeypatch.setattr(episode, "TARGET_CHUNK", spec.target_size)  # the target set in one piece
    jax.clear_caches()
    whole = temp_bytes(*build(name, spec, image=image, **narrow))
    monkeypatch.undo()
    jax.clear_caches()
    learner, params = build(name, spec, image=image, **narrow)
    chunked = temp_bytes(learner, params)
    assert chunked < 2**29 and whole > 4 * chunked, (chunked, whole)  # measured: 131 MB, 1.22 GB
    report = evaluation.evaluate(learner, params, many_classes, num_tasks=1, mesh=mesh)
    correct = report["acc_mean"] * spec.target_size  # one task: a count of target samples
    # a float32 mean of 16,000 zeros and ones, times 16,000: a whole count to float32 rounding
    assert correct == pytest.approx(round(correct), abs=5e-3) and np.isfinite(report["ce_mean"])
    assert report["macs_per_task"] > spec.nss * report["macs_adapt"]


def test_a_cpu_mesh_gives_the_same_numbers_while_the_default_device_is_elsewhere(split):
    # What a GPU host does with cpu_mesh: arrays made on the default device (here CPU
    # device 7, outside the mesh) move to the mesh's devices; the numbers do not change.
    learner, params = build("protonets")
    mesh = cpu_mesh(4)
    expected = evaluation.evaluate(learner, params, split, num_tasks=8, batch_size=2,
                                   cost_metrics=False, mesh=mesh)
    with jax.default_device(jax.devices("cpu")[FAKE_DEVICES - 1]):
        moved = evaluation.evaluate(learner, params, split, num_tasks=8, batch_size=2,
                                    cost_metrics=False, mesh=mesh)
    for name in SUMMARY:
        assert moved[name] == expected[name], name


def test_verify_retests_on_the_recorded_device_count(split):
    # A run tested on 1 device, verified on a host of 8: the 8-device program rounds otherwise
    # (test_gradient_learner_evaluation_on_8_devices_matches), so verify's bit-equal re-test
    # must run on the recorded device count, or it reports DIFFERS for an intact run.
    from cfsl_jax.experiments import verify
    spec = TaskSpec(nss=3, nc=2, ks=1, kt=2, cci=1, overwrite=False, target_mode="per_class")
    learner, params = build("init_tune", spec, filters=4)
    recorded = evaluation.evaluate(learner, params, split, num_tasks=5, batch_size=2,
                                   cost_metrics=False, mesh=cpu_mesh(1), per_task=True)
    mesh = verify.tested_mesh(recorded)
    assert mesh is not None and mesh.size == 1
    again = evaluation.evaluate(learner, params, split, num_tasks=5, batch_size=2,
                                cost_metrics=False, mesh=mesh, per_task=True)
    assert again.per_task == recorded.per_task and again.ce_mean == recorded.ce_mean
    assert verify.tested_mesh(recorded.replace(devices=FAKE_DEVICES + 1)) is None
