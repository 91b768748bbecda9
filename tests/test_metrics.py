"""Metrics with known values: accuracy, CE, summaries, per-group accuracy, ATM, XLA MACs."""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax.runtime import backend
from cfsl_jax.protocol import episode, metrics
from cfsl_jax.learners import get_learner
from cfsl_jax.training.records import EvalRecord
from cfsl_jax.models import conv
from cfsl_jax.protocol.learner import Learner, Recipe
from cfsl_jax.protocol.spec import TaskSpec
from conftest import init_params

IMAGE = (28, 28, 1)


def test_accuracy_and_cross_entropy_known_values():
    logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    labels = jnp.array([0, 1, 0, 2])
    assert float(metrics.accuracy(logits, labels)) == pytest.approx(0.5)  # ties -> index 0
    expected = np.mean([
        -math.log(math.exp(2) / (math.exp(2) + 2)),
        -math.log(math.exp(3) / (math.exp(3) + 2)),
        -math.log(math.exp(1) / (math.exp(1) + 1 + math.exp(5))),
        math.log(3),
    ])
    assert float(metrics.cross_entropy(logits, labels)) == pytest.approx(expected, rel=1e-6)


def test_summarize_known_values():
    summary = metrics.summarize([0.2, 0.4, 0.6, 0.8])
    assert summary["mean"] == pytest.approx(0.5)
    assert summary["std"] == pytest.approx(math.sqrt(0.05))
    assert summary["ci95"] == pytest.approx(1.96 * math.sqrt(0.05) / 2)


def test_across_runs_is_the_sample_std_with_a_student_t_interval():
    spread = metrics.across_runs([1.0, 2.0, 3.0])  # std (ddof=1) 1, t(0.975, 2) = 4.303
    assert spread == (2.0, 1.0, pytest.approx(4.303 / math.sqrt(3)), 3)
    assert metrics.across_runs([0.5]) == (0.5, 0.0, 0.0, 1)
    assert metrics.t975(1) == 12.706 and metrics.t975(30) == 2.042
    assert metrics.t975(60) == pytest.approx(2.000, abs=1e-3)  # the table's value at 60
    assert metrics.t975(120) == pytest.approx(1.980, abs=1e-3)


def test_group_accuracy_known_values():
    logits = jax.nn.one_hot(jnp.array([0, 1, 2, 3, 0, 0]), 4)  # predictions 0 1 2 3 0 0
    labels = jnp.array([0, 1, 2, 2, 3, 0])
    groups = jnp.array([0, 0, 1, 1, 1, 0])
    np.testing.assert_allclose(metrics.group_accuracy(logits, labels, groups, 3),
                               [1.0, 1 / 3, 0.0])


def test_protonets_atm_is_prototype_bytes_over_support_bytes():
    spec = TaskSpec.preset("B3")  # 15 output units, 3 support sets of 5 images
    learner = get_learner("protonets", spec)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    # Conv-4 on 28x28: 28 -> 14 -> 7 -> 3 -> 1, so a 64-d embedding; float32 sums, int32 counts.
    state_bytes = 15 * 64 * 4 + 15 * 4
    support_bytes = 3 * 5 * 28 * 28 * 1 * 4
    assert metrics.atm(learner, params, IMAGE) == pytest.approx(state_bytes / support_bytes)
    half = get_learner("protonets", spec, state_dtype=jnp.bfloat16)  # bf16 sums only
    half_bytes = 15 * 64 * 2 + 15 * 4
    assert metrics.atm(half, params, IMAGE) == pytest.approx(half_bytes / support_bytes)
    # against bf16 inputs the support bytes halve too
    assert metrics.atm(half, params, IMAGE, jnp.bfloat16) == pytest.approx(
        half_bytes / (support_bytes / 2))


class LinearState(NamedTuple):
    weights: jax.Array  # float32 [784, num_outputs]


def linear_learner(spec) -> Learner:
    """One linear layer whose adapt sets the weights to X^T onehot(y) (a Hebbian read-in)."""

    def adapt(params, state, support_x, support_y):
        flat = support_x.reshape(support_x.shape[0], -1)
        return LinearState(flat.T @ jax.nn.one_hot(support_y, spec.num_outputs))

    def predict(params, state, target_x):
        return target_x.reshape(target_x.shape[0], -1) @ state.weights

    return Learner("linear", spec, lambda key, x, spec: {},
                   lambda params, key, spec: LinearState(jnp.zeros((784, spec.num_outputs))),
                   adapt, predict, Recipe(training="none"))


def test_linear_learner_macs_equal_the_hand_count():
    spec = TaskSpec(nss=4, nc=5, ks=2, kt=3, cci=1, overwrite=False)  # 20 outputs
    macs = metrics.learner_macs(linear_learner(spec), {}, IMAGE)
    # predict: a [T, 784] x [784, 20] product.
    assert macs["macs_predict"] == spec.target_size * 784 * 20
    # adapt: a [784, 10] x [10, 20] product plus the one-hot (compare + convert, 2 flops each).
    assert macs["macs_adapt"] == 784 * 10 * 20 + 10 * 20
    assert macs["macs_per_task"] == 4 * macs["macs_adapt"] + macs["macs_predict"]
    assert metrics.atm(linear_learner(spec), {}, IMAGE) == pytest.approx(
        784 * 20 * 4 / (4 * 10 * 784 * 4))


def test_state_that_changes_shape_is_refused():
    spec = TaskSpec.preset("B3")
    bad = linear_learner(spec)._replace(
        adapt=lambda params, state, x, y: LinearState(jnp.zeros((784, 3))))
    with pytest.raises(ValueError, match="adapt changes the state"):
        metrics.atm(bad, {}, IMAGE)


# ---- MACs are XLA:CPU's count on every backend ----------------------------------------------

TINY = TaskSpec(nss=2, nc=2, ks=1, kt=1, cci=1, overwrite=False, target_mode="per_class")
SMALL = (16, 16, 1)
TINY_OPTIONS = {"maml_low": dict(filters=3, num_blocks=2, inner_steps=2, unroll=True),
                "maml_high": dict(filters=4, embed_filters=4, growth=4, inner_steps=2,
                                  unroll=True),
                "sca": dict(filters=4, embed_filters=4, growth=4, inner_steps=2, unroll=True)}


def tiny(name):
    learner = get_learner(name, TINY, image_shape=SMALL,
                          **TINY_OPTIONS.get(name, dict(filters=4)))
    return learner, init_params(learner, jax.random.key(0), jnp.zeros((1, *SMALL)), TINY)


@pytest.fixture
def another_backend(monkeypatch):
    """A CPU-simulated accelerator host: the default backend says "gpu", whose "auto"
    convolution differs from the CPU's, and the default device is not the counting device."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setitem(conv.AUTO_IMPLS, "gpu", "gemm_grad")  # not conv.COUNTED_IMPL
    assert backend.lowering_platform() == "gpu" and conv.resolve_conv_impl("auto") == "gemm_grad"
    with jax.default_device(jax.devices("cpu")[-1]):
        yield


def test_macs_are_counted_for_the_cpu_whatever_the_default_backend(another_backend):
    seen = []

    def fn(x):
        seen.append((backend.lowering_platform(), conv.resolve_conv_impl("auto")))
        return jnp.tanh(x @ x.T).sum()

    x = jax.device_put(jnp.ones((4, 3)), jax.devices("cpu")[2])  # committed elsewhere
    assert metrics.xla_macs(fn, x) == metrics.xla_macs(fn, jnp.ones((4, 3)))
    assert seen and set(seen) == {("cpu", conv.COUNTED_IMPL)}  # every trace-time choice: the
    # CPU's, and the counted convolution


# One learner per family (Conv-4 embedding, Conv-4 fine-tuning with EWC, MAML++ low-end,
# SCA = MAML++ high-end + critic); every other learner is built from the same modules.
@pytest.mark.parametrize("name", ["protonets", "ewc_init", "maml_low", "sca"])
def test_learner_macs_equal_the_cpu_count_on_another_backend(name, request):
    learner, params = tiny(name)
    expected = metrics.learner_macs(learner, params, SMALL)
    assert all(value > 0 for value in expected.values())
    request.getfixturevalue("another_backend")
    assert metrics.learner_macs(learner, params, SMALL) == expected


def test_meta_step_macs_equal_the_cpu_count_on_another_backend(request):
    learner, params = tiny("maml_low")  # second order through "auto" convolutions
    expected = episode.meta_step_macs(learner, params, SMALL)
    request.getfixturevalue("another_backend")
    assert episode.meta_step_macs(learner, params, SMALL) == expected > 0


def test_the_cpu_backend_is_required_to_count(monkeypatch):
    def no_cpu(platform=None):
        raise RuntimeError(f"Unknown backend {platform}")

    monkeypatch.setattr(jax, "devices", no_cpu)
    with pytest.raises(RuntimeError, match="MACs are counted by XLA:CPU.*JAX_PLATFORMS=cuda,cpu"):
        metrics.xla_macs(lambda x: x * 2, jnp.ones(3))


def test_eval_record_reads_an_older_results_entry_and_writes_it_back_unchanged():
    stored = {"acc_mean": 0.75, "acc_std": 0.1, "acc_ci95": 0.0196, "ce_mean": 0.6,
              "ce_std": 0.2, "ce_ci95": 0.0392, "group_acc": [0.8, 0.7], "num_tasks": 100,
              "devices": 8, "task_fingerprint": "ab" * 32, "seconds": 2.0, "tasks_per_s": 50.0,
              "atm": 0.083, "macs_adapt": 1e6, "macs_predict": 2e6, "macs_per_task": 5e6}
    record = EvalRecord.from_json({**stored, "unknown_key": 1})  # before dataset_identity
    assert record.acc_mean == 0.75 and record.group_acc == (0.8, 0.7)
    assert record.dataset_identity is None and record.macs_per_meta_step is None
    assert record["ce_mean"] == 0.6 and "atm" in record and "per_task" not in record
    assert record.to_json() == stored
    newer = record.replace(dataset_identity="synthetic [generated] test 3 classes 24 images")
    assert EvalRecord.from_json(newer.to_json()) == newer
    with pytest.raises(KeyError):
        record["acc"]


@pytest.mark.parametrize("name", ["protonets", "maml_low"])
def test_macs_do_not_depend_on_the_convolution_implementation(name):
    """``conv`` chooses how a convolution is computed, not what it is: every implementation
    counts XLA's convolution (its taps, SAME padding's left out), also for a learner whose
    programs ran before they were counted (ProtoNets' "auto" evaluates with gemm_grad)."""
    counts, ran = {}, {}
    support = jnp.zeros((TINY.support_size, *SMALL))
    labels = jnp.zeros(TINY.support_size, jnp.int32)
    # the programs run on the counting device itself (a notebook's default device): jit's
    # caches must not hand the counted trace to the run, nor the run's trace to the count
    with jax.default_device(backend.counting_device()):
        for impl in ("auto", "gemm_grad", "im2col", "xla"):
            learner, params = tiny_with(name, conv=impl)
            state = learner.init(params, jax.random.key(0), TINY)
            first = jax.jit(learner.adapt)(params, state, support, labels)  # run, then count
            counts[impl] = (metrics.learner_macs(learner, params, SMALL),
                            metrics.learner_macs(learner.evaluated, params, SMALL),
                            episode.meta_step_macs(learner, params, SMALL))
            after = jax.jit(learner.adapt)(params, state, support, labels)  # count, then run
            assert jax.tree.all(jax.tree.map(jnp.array_equal, first, after))
            ran[impl] = jax.jit(learner.adapt).lower(params, state, support, labels).as_text()
    assert len({repr(c) for c in counts.values()}) == 1, counts
    assert counts["auto"][0]["macs_per_task"] > 0
    assert ran["im2col"] != ran["xla"]  # the runs computed with their own convolutions


def tiny_with(name, **options):
    learner = get_learner(name, TINY, image_shape=SMALL,
                          **{**TINY_OPTIONS.get(name, dict(filters=4)), **options})
    return learner, init_params(learner, jax.random.key(0), jnp.zeros((1, *SMALL)), TINY)
