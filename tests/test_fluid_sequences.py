"""FLUID streams: Zipf statistics, flag consistency, determinism, disjoint pretraining data."""

import jax
import numpy as np
import pytest

from cfsl_jax import fluid
from cfsl_jax.fluid.experiment import alphabet_pretrain_mask
from cfsl_jax.fluid.sequences import capped_counts, zipf_shares


def table_of(num_classes, size, ragged=False):
    """A class table whose row c holds indices c*size .. (padded -1 when ragged)."""
    table = np.arange(num_classes * size, dtype=np.int32).reshape(num_classes, size)
    sizes = np.full(num_classes, size, np.int32)
    if ragged:
        sizes = np.maximum(size - np.arange(num_classes) % 7 * 3, 1).astype(np.int32)
        table[np.arange(size)[None, :] >= sizes[:, None]] = -1
    return table, sizes


def fitted_exponent(classes):
    """-slope of log count vs log rank over classes with >= 5 samples that were not capped."""
    caps = np.where(classes.is_pretrain, 990, 1000)  # size 1000 - min_pretrain_samples 10
    keep = (classes.count >= 5) & (classes.count < caps)
    slope = np.polyfit(np.log(classes.rank[keep]), np.log(classes.count[keep]), 1)[0]
    return -slope, int(keep.sum())


@pytest.mark.parametrize("s", [0.5, 1.0, 1.5])
def test_class_frequencies_follow_the_zipf_exponent(s):
    table, sizes = table_of(30, 1000)
    config = fluid.StreamConfig(num_classes=20, length=3000, zipf_s=s)
    stream, classes = fluid.make_stream(jax.random.key(1), table, sizes, config)
    exponent, fitted = fitted_exponent(classes)
    assert fitted >= 15
    assert exponent == pytest.approx(s, abs=0.05)
    np.testing.assert_array_equal(np.bincount(np.asarray(stream.label), minlength=20),
                                  classes.count)


def test_zipf_zero_is_uniform_and_caps_are_respected():
    counts = capped_counts(zipf_shares(10, 0.0), np.full(10, 100), 503)
    assert counts.sum() == 503 and counts.max() - counts.min() <= 1
    caps = np.array([5, 1000, 1000, 1000, 2])
    counts = capped_counts(zipf_shares(5, 1.0), caps, 400)
    assert counts.sum() == 400 and np.all(counts <= caps) and np.all(counts >= 1)
    assert counts[0] == 5 and counts[4] == 2  # capped; the rest share the remainder
    ratio = counts[1] / counts[3]  # uncapped classes keep the Zipf ratio 4/2
    assert ratio == pytest.approx(2.0, abs=0.02)


def test_flags_are_consistent_with_the_classes():
    table, sizes = table_of(40, 60, ragged=True)
    config = fluid.StreamConfig(num_classes=25, length=700, pretrain_fraction=0.4,
                                head_threshold=30, min_pretrain_samples=5)
    stream, classes = fluid.make_stream(jax.random.key(2), table, sizes, config)
    label = np.asarray(stream.label)
    idx = np.asarray(stream.sample_idx)
    assert label.shape == (700,) and set(np.unique(label)) == set(range(25))
    assert classes.is_pretrain.sum() == config.num_pretrain == 10
    np.testing.assert_array_equal(np.asarray(stream.is_pretrain_class), label < 10)
    np.testing.assert_array_equal(classes.is_head, classes.count > 30)
    np.testing.assert_array_equal(np.asarray(stream.is_head_class), classes.is_head[label])
    assert classes.is_head.any() and not classes.is_head.all()
    first = np.asarray(stream.first_appearance)
    assert first.sum() == 25
    for k in range(25):
        assert np.flatnonzero(first & (label == k)) == np.flatnonzero(label == k)[0]
        members = set(table[classes.split_class[k]][table[classes.split_class[k]] >= 0])
        assert set(idx[label == k]) <= members  # samples come from their own class
    assert len(set(idx)) == idx.size  # no sample twice
    assert np.all(classes.count[:10] <= sizes[classes.split_class[:10]] - 5)


def test_same_key_same_stream_other_key_other_stream():
    table, sizes = table_of(30, 50)
    config = fluid.StreamConfig(num_classes=12, length=300)
    a = fluid.make_stream(jax.random.key(7), table, sizes, config)
    b = fluid.make_stream(jax.random.key(7), table, sizes, config)
    c = fluid.make_stream(jax.random.key(8), table, sizes, config)
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(a[1].pretrain_table, b[1].pretrain_table)
    assert not np.array_equal(np.asarray(a[0].sample_idx), np.asarray(c[0].sample_idx))


def test_pretraining_data_and_stream_are_disjoint_and_complete():
    table, sizes = table_of(30, 40, ragged=True)
    config = fluid.StreamConfig(num_classes=16, length=300, pretrain_fraction=0.5,
                                min_pretrain_samples=4)
    stream, classes = fluid.make_stream(jax.random.key(3), table, sizes, config)
    idx, label = np.asarray(stream.sample_idx), np.asarray(stream.label)
    pre_table, pre_sizes = fluid.sequences.pretrain_class_table(classes)
    assert pre_table.shape[0] == 8 and np.all(pre_sizes >= 4)
    for k in range(8):
        pretrain_samples = set(pre_table[k][pre_table[k] >= 0])
        stream_samples = set(idx[label == k])
        row = table[classes.split_class[k]]
        assert not pretrain_samples & stream_samples
        assert pretrain_samples | stream_samples == set(row[row >= 0])
    novel_rows = table[classes.split_class[8:]]
    assert not set(pre_table[pre_table >= 0]) & set(novel_rows[novel_rows >= 0])


def test_staggered_order_introduces_classes_over_time():
    table, sizes = table_of(30, 200)
    late = {}
    for order in fluid.sequences.ORDERS:
        config = fluid.StreamConfig(num_classes=20, length=1500, order=order)
        stream, _ = fluid.make_stream(jax.random.key(4), table, sizes, config)
        late[order] = np.mean(np.flatnonzero(np.asarray(stream.first_appearance)) > 750)
    assert late["staggered"] >= 0.15 > late["uniform"]


def test_pretrain_mask_picks_pretrain_and_novel_classes_from_its_sides():
    table, sizes = table_of(30, 50)
    mask = np.arange(30) % 3 == 0
    config = fluid.StreamConfig(num_classes=12, length=200, pretrain_fraction=0.5)
    _, classes = fluid.make_stream(jax.random.key(5), table, sizes, config, pretrain_mask=mask)
    assert mask[classes.split_class[:6]].all() and not mask[classes.split_class[6:]].any()
    with pytest.raises(ValueError, match="7 pretrain and 21 novel"):
        fluid.make_stream(jax.random.key(5), table, sizes,
                          fluid.StreamConfig(num_classes=28, length=200, pretrain_fraction=0.25),
                          pretrain_mask=mask)


def test_alphabet_mask_keeps_alphabets_whole():
    names = tuple(f"{a}/character{i:02d}" for a, n in (("Greek", 4), ("Latin", 3), ("Thai", 5))
                  for i in range(n))
    mask = alphabet_pretrain_mask(names, 0.6)  # 4 + 3 = 7 <= 7.2 classes
    np.testing.assert_array_equal(mask, [True] * 7 + [False] * 5)
    assert alphabet_pretrain_mask(names, 0.1).sum() == 4  # at least one alphabet


def test_bad_configs_are_refused_with_the_numbers():
    table, sizes = table_of(10, 20)
    with pytest.raises(ValueError, match="num_classes=11 exceeds the split's 10"):
        fluid.make_stream(jax.random.key(0), table, sizes,
                          fluid.StreamConfig(num_classes=11, length=100))
    with pytest.raises(ValueError, match="length=1000 .* available to the stream"):
        fluid.make_stream(jax.random.key(0), table, sizes,
                          fluid.StreamConfig(num_classes=10, length=1000))
    with pytest.raises(ValueError, match="length=5 is invalid"):
        fluid.StreamConfig(num_classes=10, length=5)
    with pytest.raises(ValueError, match="order='random' is invalid"):
        fluid.StreamConfig(order="random")


def test_pretraining_only_classes_never_enter_the_stream():
    table, sizes = table_of(40, 30, ragged=True)
    narrow = fluid.StreamConfig(num_classes=20, length=300, pretrain_fraction=0.25,
                                min_pretrain_samples=4)
    wide = fluid.StreamConfig(**{**narrow.__dict__, "pretrain_classes": 20})  # P=5, 15 extra
    a_stream, a = fluid.make_stream(jax.random.key(6), table, sizes, narrow)
    b_stream, b = fluid.make_stream(jax.random.key(6), table, sizes, wide)
    for x, y in zip(a_stream, b_stream):  # the same stream, only the pretraining set grows
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert a.extra_class.size == 0 and b.extra_class.size == 15
    assert len(set(b.extra_class)) == 15 and not set(b.extra_class) & set(b.split_class)
    np.testing.assert_array_equal(b.extra_table, table[b.extra_class])  # all their samples
    pre_table, pre_sizes = fluid.sequences.pretrain_class_table(b, extra=True)
    assert pre_table.shape[0] == 20
    np.testing.assert_array_equal(pre_sizes, np.r_[(a.pretrain_table >= 0).sum(1),
                                                   sizes[b.extra_class]])
    assert not set(pre_table[pre_table >= 0]) & set(np.asarray(b_stream.sample_idx))
    same = fluid.make_stream(jax.random.key(6), table, sizes, wide)[1]
    other = fluid.make_stream(jax.random.key(7), table, sizes, wide)[1]
    np.testing.assert_array_equal(same.extra_class, b.extra_class)
    assert not np.array_equal(other.extra_class, b.extra_class)
    mask = np.arange(40) % 2 == 0  # with a pretrain mask: extras from its side only
    _, masked = fluid.make_stream(jax.random.key(6), table, sizes,
                                  fluid.StreamConfig(**{**wide.__dict__, "pretrain_classes": 12}),
                                  pretrain_mask=mask)
    assert masked.extra_class.size == 7 and mask[masked.extra_class].all()
    with pytest.raises(ValueError, match="pretrain_classes=26 needs 21 classes outside the "
                                         "stream's 20, but the split offers 20"):
        fluid.make_stream(jax.random.key(6), table, sizes,
                          fluid.StreamConfig(**{**wide.__dict__, "pretrain_classes": 26}))
    with pytest.raises(ValueError, match="pretrain_classes=4 is invalid: must be 0 .* >= the "
                                         "stream's 5 pretrain classes"):
        fluid.StreamConfig(**{**wide.__dict__, "pretrain_classes": 4})


def test_disjoint_draw_keeps_the_streams_apart_as_the_papers_sequences():
    """App. B: test sequences drawn "without replacement to ensure that the sequences do not
    overlap"; validation sequences share pretrain classes only. One pretraining world of
    W=30 classes (the ImageNet-1K analogue), P=5 pretrain + N=15 novel classes a stream, a
    split of 30 + 5 x 15 classes: 3 test and 2 validation streams fit exactly."""
    from cfsl_jax.fluid.class_draw import check_room, draw_classes
    from cfsl_jax.runtime.errors import UserError
    config = fluid.StreamConfig(num_classes=20, length=200, pretrain_fraction=0.25,
                                min_pretrain_samples=4, pretrain_classes=30)
    key = jax.random.key(3)
    tests = [draw_classes(key, 105, config, i) for i in range(3)]
    validations = [draw_classes(key, 105, config, j, validation=True) for j in range(2)]
    world = set(tests[0].extra) | set(tests[0].chosen[:5])
    assert len(world) == 30
    for draw in tests + validations:
        assert len(set(draw.chosen)) == 20 and set(draw.chosen[:5]) <= world
        assert not set(draw.chosen[5:]) & world  # no novel class is ever pretrained on
        assert set(draw.extra) == world - set(draw.chosen[:5]) and list(draw.extra) == sorted(
            draw.extra)
    for a, b in [(0, 1), (0, 2), (1, 2)]:  # test streams share no class at all
        assert not set(tests[a].chosen) & set(tests[b].chosen)
    novel = [set(d.chosen[5:]) for d in tests + validations]  # no novel class in two streams
    assert len(set().union(*novel)) == 5 * 15
    # validation pretrain classes come from the world's end: validation 0 takes the last 5
    # world positions, test 2 positions 10-14, validation 1 positions 20-24
    assert not set(validations[0].chosen[:5]) & set().union(*(set(t.chosen) for t in tests))
    np.testing.assert_array_equal(draw_classes(key, 105, config, 1).chosen, tests[1].chosen)
    assert not np.array_equal(draw_classes(jax.random.key(4), 105, config, 1).chosen,
                              tests[1].chosen)
    check_room(key, 105, config, tests=3, validations=2)
    with pytest.raises(UserError, match="3 test and 3 validation stream.s. needs 90 novel "
                                        "classes, 15 a stream, but the split has 75 besides "
                                        "the 30 pretraining classes"):
        check_room(key, 105, config, tests=3, validations=3)
    with pytest.raises(UserError, match="test stream 5 needs 90 novel classes"):
        draw_classes(key, 105, config, 5)
    # The stream is built on the draw: its classes and pretraining-only classes are the draw's.
    table, sizes = table_of(105, 40)
    stream, classes = fluid.make_stream(jax.random.key(9), table, sizes, config, draw=tests[2])
    np.testing.assert_array_equal(classes.split_class, tests[2].chosen)
    np.testing.assert_array_equal(classes.extra_class, tests[2].extra)
    np.testing.assert_array_equal(classes.extra_table, table[tests[2].extra])
    assert set(np.asarray(stream.sample_idx) // 40) <= set(tests[2].chosen)
    # pretrain_classes=0 (the stream's pretrain classes only): the world is P classes, every
    # stream has the same ones, and no pretraining-only class
    narrow = fluid.StreamConfig(**{**config.__dict__, "pretrain_classes": 0})
    a, b = draw_classes(key, 105, narrow, 0), draw_classes(key, 105, narrow, 1)
    np.testing.assert_array_equal(a.chosen[:5], b.chosen[:5])
    assert a.extra.size == 0 and not set(a.chosen[5:]) & set(b.chosen[5:])


def test_the_experiments_streams_share_no_novel_class_unless_drawn_independently():
    """The experiment's test and validation streams (the validation ones tune the new-class
    threshold): class_draw=disjoint keeps their novel classes apart; independent is the
    earlier per-stream draw, its classes from the stream key."""
    import dataclasses

    from cfsl_jax import data
    from cfsl_jax.fluid import experiment
    split = data.load_split("synthetic", "train", num_classes=60, samples_per_class=30,
                            image_size=8)  # 44 train classes: 8 + 4 x 9 fits
    stream = fluid.StreamConfig(num_classes=12, length=120, pretrain_fraction=0.25,
                                min_pretrain_samples=5, pretrain_classes=8)
    config = experiment.FluidConfig(methods=("ncm",), stream=stream, num_streams=2,
                                    validation_streams=2)
    drawn = {(kind, i): experiment.prepare_stream(dataclasses.replace(config, streams=kind),
                                                  split, i)[1]
             for kind in ("test", "validation") for i in range(2)}
    novel = [set(c.split_class[~c.is_pretrain]) for c in drawn.values()]
    assert len(set().union(*novel)) == 4 * 9
    tests = [set(drawn["test", i].split_class) for i in range(2)]
    assert not tests[0] & tests[1]
    independent = dataclasses.replace(config, class_draw="independent")
    _, alone = experiment.prepare_stream(independent, split, 0)
    _, by_key = fluid.make_stream(experiment.stream_key(config, 0), split.class_table,
                                  split.class_sizes, stream)
    np.testing.assert_array_equal(alone.split_class, by_key.split_class)
    assert not np.array_equal(alone.split_class, drawn["test", 0].split_class)
