"""FLUID methods on a small synthetic stream.

The backbone is a random Conv-4: it already separates the synthetic glyphs well
enough for NCM, and pretraining (one 10+ s compilation on a busy CPU) is
exercised by test_fluid_experiment.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cfsl_jax import data, fluid
from cfsl_jax.fluid import classifiers

IMAGE = (16, 16, 1)
K, LENGTH, U = 10, 400, 100
SCHEDULE = fluid.Schedule(update_every=U, epochs_per_update=1, batch_size=32)


@pytest.fixture(scope="module")
def setup():
    split = data.load_split("synthetic", "train", num_classes=40, samples_per_class=60,
                            image_size=IMAGE[0])
    config = fluid.StreamConfig(num_classes=K, length=LENGTH, head_threshold=40,
                                min_pretrain_samples=20)
    stream, _ = fluid.make_stream(jax.random.key(0), split.class_table, split.class_sizes,
                                        config)
    method = fluid.get_method("ncm", K, IMAGE, filters=16)
    return split, stream, method.init_params(jax.random.key(1), jnp.zeros((1, *IMAGE)))


@pytest.fixture(scope="module")
def records(setup):
    split, stream, params = setup
    out = {}
    for name in ("ncm", "exemplar_tuning", "imprinting", "finetune", "standard"):
        method = fluid.get_method(name, K, IMAGE, filters=16)
        out[name] = fluid.run_stream(method, params, stream, split, jax.random.key(3), SCHEDULE,
                                     count_macs=False)
    return out


def second_half_accuracy(record, stream):
    return float(np.mean(record.prediction[LENGTH // 2:] == np.asarray(stream.label)[LENGTH // 2:]))


def test_ncm_beats_chance_and_exemplar_tuning_matches_it(setup, records):
    _, stream, _ = setup
    ncm = second_half_accuracy(records["ncm"], stream)
    assert ncm > 0.4  # chance is 1/10 once every class has been seen
    assert second_half_accuracy(records["exemplar_tuning"], stream) >= ncm - 0.02
    assert fluid.stream_metrics(records["ncm"].prediction, records["ncm"].unseen_score,
                                stream)["auroc"] > 0.65


def test_exemplar_tuning_with_zero_residuals_is_ncm(setup):
    split, stream, params = setup
    ncm = fluid.get_method("ncm", K, IMAGE, filters=16)
    tuning = fluid.get_method("exemplar_tuning", K, IMAGE, filters=16)
    features = jax.jit(ncm.embed)(params, ncm.init(params, jax.random.key(0)),
                                  data.gather_normalised(split, stream.sample_idx[:200]))
    one_hot = jax.nn.one_hot(stream.label[:150], K)
    memory = classifiers.ClassMemory(one_hot.T @ features[:150], one_hot.sum(0))
    outputs = []
    for method in (ncm, tuning):
        state = method.init(params, jax.random.key(0))._replace(memory=memory)
        predict = jax.jit(jax.vmap(method.predict, in_axes=(None, None, 0)))
        outputs.append(predict(params, state, features[150:]))
    (ncm_label, ncm_score), (tuning_label, tuning_score) = outputs
    np.testing.assert_array_equal(tuning_label, ncm_label)
    np.testing.assert_allclose(tuning_score, ncm_score, atol=1e-6)


def test_imprinting_is_ncm_until_its_first_training_phase(records):
    np.testing.assert_array_equal(records["imprinting"].prediction[:U],
                                  records["ncm"].prediction[:U])
    assert not np.array_equal(records["imprinting"].prediction, records["ncm"].prediction)


def test_every_method_predicts_only_classes_seen_so_far(setup, records):
    _, stream, _ = setup
    label = np.asarray(stream.label)
    for name, record in records.items():
        assert record.prediction[0] == -1, name
        for t in range(1, LENGTH, 7):
            assert record.prediction[t] in set(label[:t]), (name, t)
        assert np.all(np.isfinite(record.unseen_score[1:])), name
        assert record.train_steps == (0 if name == "ncm" else 4 + 7 + 10), name


def test_bad_method_options_are_refused():
    with pytest.raises(ValueError, match="unknown FLUID method 'knn'"):
        fluid.get_method("knn", K)
    with pytest.raises(ValueError, match="ncm is instance-based"):
        fluid.get_method("ncm", K, learning_rate=0.1)
    with pytest.raises(ValueError, match="detector='energy'"):
        fluid.get_method("finetune", K, detector="energy")
    with pytest.raises(ValueError, match="num_classes=0"):
        fluid.get_method("ncm", 0)
