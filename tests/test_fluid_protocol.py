"""The FLUID protocol: predict before update (instrumented), running means, MACs accounting."""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax import data, fluid
from cfsl_jax.protocol import metrics
from cfsl_jax.fluid import classifiers, protocol

LENGTH, NUM_CLASSES = 120, 6


class ProbeState(NamedTuple):
    last_label: jax.Array  # int32 [] label of the last update
    max_index: jax.Array  # float32 [] largest sample index any training step saw (unmasked)
    index_sum: jax.Array  # float32 [] sum of the sample indices training steps saw
    count: jax.Array  # float32 [] samples training steps saw
    mismatches: jax.Array  # float32 [] training labels that differ from the sample's true label


def index_split(length):
    """A split whose image n is filled with the value n, so a feature can name its sample."""
    images = np.broadcast_to(np.arange(length, dtype=np.uint8)[:, None, None, None],
                             (length, 2, 2, 1)).copy()
    info = data.SplitInfo("index", "train", 1, length, (2, 2, 1), ("all",), "test")
    return data.Split(jnp.asarray(images), jnp.arange(length, dtype=jnp.int32)[None],
                      jnp.array([length], jnp.int32), info)


def manual_stream(labels):
    labels = np.asarray(labels, np.int32)
    first = np.zeros(labels.size, bool)
    first[np.unique(labels, return_index=True)[1]] = True
    false = jnp.zeros(labels.size, bool)
    return fluid.Stream(jnp.arange(labels.size, dtype=jnp.int32), jnp.asarray(labels), false,
                        false, jnp.asarray(first))


def probe(true_labels, train_on, report):
    """A method that reports what it was shown: predict returns the last update's label and
    one training statistic; if predict could see label t it would return it."""

    def sample_index(x):  # [n, 2, 2, 1] images of the index split -> [n] sample indices
        return jnp.round(x.mean(axis=(1, 2, 3)) * 255.0)

    def init(params, key):
        zero = jnp.float32(0)
        return ProbeState(jnp.int32(-1), jnp.float32(-1), zero, zero, zero)

    def embed(params, state, x):
        return sample_index(x)[:, None]

    def predict(params, state, feature):
        return state.last_label, getattr(state, report)

    def update(params, state, feature, label):
        return state._replace(last_label=label)

    def train_step(params, state, inputs, labels, mask, key):
        index = inputs[:, 0] if train_on == "features" else sample_index(inputs)
        wrong = mask & (labels != true_labels[index.astype(jnp.int32)])
        return ProbeState(state.last_label,
                          jnp.maximum(state.max_index, jnp.max(jnp.where(mask, index, -1.0))),
                          state.index_sum + jnp.sum(jnp.where(mask, index, 0.0)),
                          state.count + jnp.sum(mask), state.mismatches + jnp.sum(wrong))

    return fluid.Method("probe", lambda key, x: {}, init, embed, predict, update, train_step,
                        train_on)


@pytest.mark.parametrize("train_on", ["features", "images"])
def test_predictions_never_see_their_label_and_training_only_sees_the_past(train_on):
    labels = np.asarray(jax.random.randint(jax.random.key(0), (LENGTH,), 0, NUM_CLASSES))
    stream, split = manual_stream(labels), index_split(LENGTH)
    schedule = fluid.Schedule(update_every=40, epochs_per_update=2, batch_size=16)
    phase_ends = [40, 80]  # no phase after the last sample
    seen = {}
    for report in ("max_index", "index_sum", "count", "mismatches"):
        method = probe(jnp.asarray(labels), train_on, report)
        record = fluid.run_stream(method, {}, stream, split, jax.random.key(1), schedule,
                                  count_macs=False)
        seen[report] = record.unseen_score
        assert record.prediction[0] == -1
        np.testing.assert_array_equal(record.prediction[1:], labels[:-1])  # label t-1, never t
        assert record.train_steps == sum(2 * math.ceil(end / 16) for end in phase_ends)
    t = np.arange(LENGTH)
    last_end = np.select([t >= 80, t >= 40], [80, 40], 0)  # the last phase before sample t
    np.testing.assert_array_equal(seen["max_index"], last_end - 1)  # only samples < phase end
    # every epoch visits each revealed sample exactly once: E * sum(range(end)) per phase
    expected_sum = np.select([t >= 80, t >= 40], [2 * (780 + 3160), 2 * 780], 0)
    np.testing.assert_array_equal(seen["index_sum"], expected_sum)
    np.testing.assert_array_equal(seen["count"], np.select([t >= 80, t >= 40], [240, 80], 0))
    np.testing.assert_array_equal(seen["mismatches"], 0)


IMAGE = (16, 16, 1)


@pytest.fixture(scope="module")
def synthetic():
    split = data.load_split("synthetic", "train", num_classes=20, samples_per_class=40,
                            image_size=IMAGE[0])
    config = fluid.StreamConfig(num_classes=NUM_CLASSES, length=LENGTH, head_threshold=20,
                                min_pretrain_samples=5)
    stream, _ = fluid.make_stream(jax.random.key(3), split.class_table, split.class_sizes,
                                  config)
    return split, stream


@pytest.fixture(scope="module")
def ncm():
    """One NCM method for the module, so its compiled scan is shared between tests."""
    method = fluid.get_method("ncm", NUM_CLASSES, IMAGE, filters=8)
    return method, method.init_params(jax.random.key(0), jnp.zeros((1, *IMAGE)))


def test_changing_label_t_leaves_predictions_up_to_t_unchanged(synthetic, ncm):
    split, stream = synthetic
    method, params = ncm
    t = 50
    changed = stream._replace(label=stream.label.at[t].set((stream.label[t] + 1) % NUM_CLASSES))
    a = fluid.run_stream(method, params, stream, split, jax.random.key(1), count_macs=False)
    b = fluid.run_stream(method, params, changed, split, jax.random.key(1), count_macs=False)
    np.testing.assert_array_equal(a.prediction[:t + 1], b.prediction[:t + 1])
    np.testing.assert_array_equal(a.unseen_score[:t + 1], b.unseen_score[:t + 1])
    assert not np.array_equal(a.prediction, b.prediction)  # label t does matter afterwards



def test_walking_the_stream_in_progress_chunks_changes_no_number(synthetic, ncm, monkeypatch,
                                                                 capsys):
    """A method that never trains walks the stream in PROGRESS_SAMPLES chunks (a progress line
    between them): the predictions and scores are those of one scan over the whole stream."""
    split, stream = synthetic
    method, params = ncm
    whole = fluid.run_stream(method, params, stream, split, jax.random.key(1), count_macs=False)
    monkeypatch.setattr(protocol, "PROGRESS_SAMPLES", 50)  # 120 samples: chunks 50, 50, 20
    monkeypatch.setattr(protocol.progress, "INTERVAL_S", 0.0)  # a line after every chunk
    capsys.readouterr()
    chunked = fluid.run_stream(method, params, stream, split, jax.random.key(1),
                               count_macs=False)
    np.testing.assert_array_equal(chunked.prediction, whole.prediction)
    # chunks are other scan lengths, so other XLA programs: scores agree to float32 rounding
    # (5e-8 seen on some CPUs), the predictions exactly
    np.testing.assert_allclose(chunked.unseen_score, whole.unseen_score, rtol=1e-6, atol=0)
    lines = [line for line in capsys.readouterr().out.splitlines() if "[FLUID ncm]" in line]
    assert [line.split(" samples")[0] for line in lines] == [
        "[FLUID ncm] 50/120", "[FLUID ncm] 100/120", "[FLUID ncm] 120/120"]
    # the ETA comes from the steady rate: not from the first chunk (it compiles), from the second
    assert "ETA" not in lines[0] and "ETA" in lines[1] and "done in" in lines[-1]

def test_ncm_running_means_equal_batch_means(synthetic, ncm):
    split, stream = synthetic
    method, params = ncm
    state = method.init(params, jax.random.key(1))
    features = jax.jit(method.embed)(params, state,
                                     data.gather_normalised(split, stream.sample_idx))
    state, _ = protocol.make_scan(method)(params, state, features, stream.label)
    label = np.asarray(stream.label)
    batch_means = np.stack([np.asarray(features)[label == k].mean(0) for k in range(NUM_CLASSES)])
    np.testing.assert_allclose(classifiers.class_means(state.memory), batch_means, atol=1e-5)
    np.testing.assert_array_equal(state.memory.counts, np.bincount(label, minlength=NUM_CLASSES))


def test_total_macs_is_the_sum_of_per_call_cost_analyses(synthetic):
    split, stream = synthetic
    method = fluid.get_method("exemplar_tuning", NUM_CLASSES, IMAGE, filters=8)
    params = method.init_params(jax.random.key(0), jnp.zeros((1, *IMAGE)))
    schedule = fluid.Schedule(update_every=50, epochs_per_update=2, batch_size=16)
    record = fluid.run_stream(method, params, stream, split, jax.random.key(1), schedule)

    state = method.init(params, jax.random.key(0))
    x = jnp.zeros((1, *IMAGE))
    feature = method.embed(params, state, x)[0]
    embed = metrics.xla_macs(method.embed, params, state, x)
    predict = metrics.xla_macs(method.predict, params, state, feature)
    update = metrics.xla_macs(method.update, params, state, feature, jnp.int32(0))
    def step(batch):
        return metrics.xla_macs(method.train_step, params, state,
                                jnp.zeros((batch, feature.size)), jnp.zeros(batch, jnp.int32),
                                jnp.ones(batch, bool), jax.random.key(0))

    steps = 2 * math.ceil(50 / 16) + 2 * math.ceil(100 / 16)  # 2 * 4 + 2 * 7 = 22
    rows = 2 * 50 + 2 * 100  # the real rows; 22 * 16 - 300 = 52 padded rows do not count
    row = (step(16) - step(8)) / 8
    assert record.train_steps == steps and record.macs["train_rows"] == rows
    assert embed > 5e4 and predict > 0 and row > 0
    assert step(12) == pytest.approx(step(8) + 4 * row, rel=1e-6)  # a step is linear in rows
    assert record.macs["per_call_train_row"] == pytest.approx(row, rel=1e-9)
    training = steps * step(16) - (steps * 16 - rows) * row
    assert record.macs["training"] == pytest.approx(training, rel=1e-9)
    assert record.macs["training"] < steps * step(16)
    assert record.macs["total"] == pytest.approx(LENGTH * (embed + predict + update) + training,
                                                 rel=1e-9)
    # Without feature caching every training row is embedded again.
    assert record.macs["total_uncached"] == pytest.approx(record.macs["total"] + rows * embed,
                                                          rel=1e-9)
    # Per-call counts add up: XLA counts two embeds in one program as twice one.
    two = metrics.xla_macs(lambda p, s, x: (method.embed(p, s, x), method.embed(p, s, 2 * x)),
                           params, state, x)
    assert two == pytest.approx(2 * embed, rel=1e-3)


def test_schedule_phases_and_scaling_follow_the_paper():
    paper = fluid.Schedule()  # 4 epochs every 5,000 samples, batch 256
    assert (paper.update_every, paper.epochs_per_update, paper.batch_size) == (5000, 4, 256)
    assert paper.phase_ends(90_000) == list(range(5000, 90_000, 5000))  # 17 phases
    imprinting = fluid.Schedule(start=10_000)
    assert imprinting.phase_ends(20_001) == [10_000, 15_000, 20_000]
    oltr = fluid.Schedule(warmup_every=200, warmup_until=10_000)
    ends = oltr.phase_ends(90_000)
    assert ends[:3] == [200, 400, 600] and 10_000 in ends and 10_200 not in ends
    assert len(ends) == 50 + 17 - 2  # 200..10,000 and 5,000..85,000 share 5,000 and 10,000
    small = oltr.scaled(9000)  # a tenth of the paper's length: every count / 10
    assert (small.update_every, small.warmup_every, small.warmup_until) == (500, 20, 1000)
    assert fluid.Schedule(start=10_000).scaled(900).start == 100
    assert paper.steps(5000) == 4 * math.ceil(5000 / 256)
    with pytest.raises(ValueError, match="update_every must be a positive integer, got 0"):
        fluid.Schedule(update_every=0)


def test_the_package_names_are_their_modules_objects_and_the_method_names_are_the_registry():
    """``cfsl_jax.fluid`` imports lazily (``fluid.config`` needs no JAX, so ``launch.fluid``
    checks its flags first): each exported name is its defining module's object, and the
    method names the flags check are the methods ``fluid.methods`` builds, in order."""
    import importlib
    for name in fluid.__all__:
        module = importlib.import_module(f"cfsl_jax.fluid.{fluid._LAZY[name]}")
        assert getattr(fluid, name) is getattr(module, name), name
    assert {"make_stream", "sequences", "Schedule"} <= set(dir(fluid))
    assert fluid.sequences.StreamConfig is fluid.config.StreamConfig
    assert protocol.Schedule is fluid.config.Schedule
    assert fluid.METHODS == tuple(fluid.methods.SPECS) and len(fluid.METHODS) == 11
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        fluid.nope
