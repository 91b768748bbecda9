"""The episode protocol and ProtoNets: one support set per adapt call, prototypes, invariances."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from cfsl_jax.protocol import episode
from cfsl_jax.learners import get_learner
from cfsl_jax.protocol.learner import Learner
from cfsl_jax.models.conv4 import Conv4
from cfsl_jax.protocol.spec import TaskSpec
from conftest import init_params, traces_counted

IMAGE = (28, 28, 1)


def random_task(spec, seed=0):
    """Random images with the label layout of a real task (labels from the spec's groups)."""
    keys = jax.random.split(jax.random.key(seed), 3)
    support_x = jax.random.uniform(keys[0], (spec.nss, spec.support_size, *IMAGE))
    group = jnp.arange(spec.nss)[:, None] // spec.cci
    position = jnp.tile(jnp.repeat(jnp.arange(spec.nc), spec.ks), (spec.nss, 1))
    support_y = position if spec.overwrite else group * spec.nc + position
    target_x = jax.random.uniform(keys[1], (spec.target_size, *IMAGE))
    return support_x, support_y.astype(jnp.int32), target_x


class Record(NamedTuple):
    calls: jax.Array  # int32 [] adapt calls so far
    checksums: jax.Array  # float32 [NSS] sum of the inputs adapt saw in call n
    shapes_ok: jax.Array  # bool [] every call got exactly [NC*KS, H, W, C]


def recording_learner(spec) -> Learner:
    """A learner whose state records what each adapt call received."""

    def adapt(params, state, support_x, support_y):
        ok = support_x.shape == (spec.support_size, *IMAGE) and support_y.shape == (
            spec.support_size,)
        return Record(state.calls + 1, state.checksums.at[state.calls].set(support_x.sum()),
                      state.shapes_ok & ok)

    return Learner(
        name="recording", spec=spec, init_params=lambda key, x, spec: {},
        init=lambda params, key, spec: Record(jnp.int32(0), jnp.zeros(spec.nss), jnp.bool_(True)),
        adapt=adapt,
        predict=lambda params, state, x: jnp.zeros((x.shape[0], spec.num_outputs)))


def test_adapt_sees_exactly_one_support_set_per_call_in_order():
    spec = TaskSpec.preset("D8")
    support_x, support_y, _ = random_task(spec)
    state = jax.jit(episode.adapt_all, static_argnums=0)(
        recording_learner(spec), {}, support_x, support_y, jax.random.key(0))
    assert int(state.calls) == spec.nss
    assert bool(state.shapes_ok)
    np.testing.assert_allclose(state.checksums, support_x.sum(axis=(1, 2, 3, 4)), rtol=1e-5)


def test_protonet_prototypes_are_the_class_means():
    spec = TaskSpec(nss=4, nc=3, ks=2, kt=1, cci=2, overwrite=False)
    learner = get_learner("protonets", spec)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    support_x, support_y, target_x = random_task(spec, seed=1)
    state = episode.adapt_all(learner, params, support_x, support_y, jax.random.key(0))
    embed = Conv4(filters=64)
    # Hand computation: embed each support set on its own (as adapt does), average per label.
    features = np.concatenate([embed.apply(params, x) for x in support_x])
    labels = np.asarray(support_y).ravel()
    for label in range(spec.num_outputs):
        mean = features[labels == label].mean(axis=0)
        np.testing.assert_allclose(state.sums[label] / state.counts[label], mean, rtol=1e-4,
                                   atol=1e-5)
        assert state.counts[label] == spec.ks * spec.cci
    # Logits are negative squared distances to those means.
    logits = episode.run_task(learner, params, support_x, support_y, target_x, jax.random.key(0))
    target_features = embed.apply(params, target_x)
    means = state.sums / state.counts[:, None]
    expected = -((target_features[:, None, :] - means[None]) ** 2).sum(-1)
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3)


def test_protonets_masks_labels_not_yet_seen():
    spec = TaskSpec(nss=2, nc=2, ks=1, kt=1, cci=1, overwrite=False)
    learner = get_learner("protonets", spec)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    support_x, support_y, target_x = random_task(spec)
    state = learner.init(params, jax.random.key(0), spec)
    state = learner.adapt(params, state, support_x[0], support_y[0])  # labels 0, 1 only
    logits = learner.predict(params, state, target_x)
    assert (np.argmax(logits, -1) < 2).all()
    assert (logits[:, 2:] == jnp.finfo(jnp.float32).min).all()


def test_protonets_is_invariant_to_support_set_order_within_a_group():
    spec = TaskSpec(nss=4, nc=5, ks=1, kt=2, cci=4, overwrite=True)  # one group of 4 sets
    learner = get_learner("protonets", spec)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    support_x, support_y, target_x = random_task(spec, seed=2)
    order = jnp.array([2, 0, 3, 1])
    run = jax.jit(episode.run_task, static_argnums=0)
    logits = run(learner, params, support_x, support_y, target_x, jax.random.key(0))
    permuted = run(learner, params, support_x[order], support_y[order], target_x,
                   jax.random.key(0))
    np.testing.assert_allclose(logits, permuted, rtol=1e-5, atol=1e-4)


def test_run_task_compiles_once_per_shape_and_vmaps():
    spec = TaskSpec.preset("B3")
    learner = get_learner("protonets", spec)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    run = jax.jit(episode.run_task, static_argnums=0)
    tasks = [random_task(spec, seed) for seed in range(3)]
    single = [run(learner, params, *tasks[0], jax.random.key(0))]
    with traces_counted() as traced:  # the same shapes again: no new program
        single += [run(learner, params, *task, jax.random.key(0)) for task in tasks[1:]]
    assert traced == [0]
    stacked = [jnp.stack(arrays) for arrays in zip(*tasks)]
    batched = jax.jit(episode.run_tasks, static_argnums=0)(
        learner, params, *stacked, jax.random.split(jax.random.key(0), 3))
    np.testing.assert_allclose(batched, jnp.stack(single), rtol=1e-4, atol=1e-3)


def test_last_per_label_keeps_each_labels_last_embedding():
    from cfsl_jax.learners.protonets import last_per_label
    features = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    previous = jnp.array([[9.0, 9.0], [8.0, 8.0], [7.0, 7.0]])
    got = last_per_label(features, jnp.array([1, 0, 1]), previous)
    np.testing.assert_array_equal(got, [[3.0, 4.0], [5.0, 6.0], [7.0, 7.0]])  # label 2: absent


def test_protonets_as_published_prototype_is_the_last_sample_over_nss_ks():
    spec = TaskSpec(nss=3, nc=2, ks=2, kt=1, cci=3, overwrite=True)  # each label: 6 samples
    learner = get_learner("protonets", spec, last_sample_prototype=True)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    support_x, support_y, target_x = random_task(spec, seed=3)
    state = episode.adapt_all(learner, params, support_x, support_y, jax.random.key(0))
    embed = Conv4(filters=64)
    last_set = embed.apply(params, support_x[-1])  # labels [0, 0, 1, 1]: rows 1 and 3 are last
    np.testing.assert_allclose(state.sums, last_set[jnp.array([1, 3])], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(state.counts, [6, 6])
    logits = episode.run_task(learner, params, support_x, support_y, target_x, jax.random.key(0))
    prototypes = last_set[jnp.array([1, 3])] / 6.0  # NSS * KS = 6
    features = embed.apply(params, target_x)
    expected = -((features[:, None, :] - prototypes[None]) ** 2).sum(-1)
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3)
    dot = get_learner("protonets", spec, last_sample_prototype=True, distance="dot")
    np.testing.assert_allclose(
        episode.run_task(dot, params, support_x, support_y, target_x, jax.random.key(0)),
        features @ prototypes.T, rtol=1e-3, atol=1e-3)


def test_meta_step_macs_count_every_target_chunk(monkeypatch):
    """A long target set is predicted in chunks (a ``lax.map``), whose body XLA's cost analysis
    counts once: the meta-step's MACs are counted with the target set in one piece, so they do
    not depend on the chunking (with 4 chunks they were 53 % of the true count at T=3,075)."""
    from cfsl_jax.protocol import metrics
    spec = TaskSpec(nss=2, nc=3, ks=1, kt=2, cci=1, overwrite=True)
    learner = get_learner("protonets", spec, filters=8)
    params = init_params(learner, jax.random.key(0), jnp.zeros((1, *IMAGE)), spec)
    counts = []
    for chunk in (spec.target_size, -(-spec.target_size // 4)):  # one piece, then 4 chunks
        monkeypatch.setattr(episode, "TARGET_CHUNK", chunk)
        monkeypatch.setattr(metrics, "_MACS_COUNTED", {})
        counts.append(episode.meta_step_macs(learner, params, IMAGE))
        assert len(episode.target_chunks(spec.target_size, chunk)[0]) == spec.target_size // chunk
    assert counts[0] == counts[1] > 0
