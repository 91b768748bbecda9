"""benchmarks/suite_profile.py: a test's record counts the programs it compiled, and the
summary adds up the records."""

import json
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import suite_profile  # noqa: E402


def test_a_tests_record_counts_what_it_compiled(tmp_path, monkeypatch):
    path = tmp_path / "profile.jsonl"
    monkeypatch.setenv("SUITE_PROFILE", str(path))
    inputs = [np.zeros((k + 1, 977), np.float32) for k in range(2)]  # no jax op before the test
    for name, programs in (("tests/test_x.py::test_a", 2), ("tests/test_x.py::test_b", 0)):
        wrapper = suite_profile.pytest_runtest_protocol(types.SimpleNamespace(nodeid=name), None)
        next(wrapper)  # the test starts
        for x in inputs[:programs]:  # shapes no other test compiles: traced and compiled here
            jax.jit(lambda x: jnp.sin(x) * 3.0)(x)
        with pytest.raises(StopIteration):
            wrapper.send(None)  # the test ends
    first, second = [json.loads(line) for line in path.read_text().splitlines()]
    assert first["test"] == "tests/test_x.py::test_a" and first["wall"] >= 0.0
    assert first[suite_profile.TRACE + "#n"] == 2 and first[suite_profile.COMPILE] > 0.0
    assert second["test"] == "tests/test_x.py::test_b"
    assert suite_profile.COMPILE not in second  # nothing compiled: no event carried over


def test_the_summary_adds_up_the_records(tmp_path, capsys):
    path = tmp_path / "profile.jsonl"
    records = [{"test": "tests/a.py::t1", "wall": 10.0, "cpu": 8.0, suite_profile.COMPILE: 3.0,
                suite_profile.COMPILE + "#n": 4, suite_profile.TRACE: 1.0},
               {"test": "tests/a.py::t2", "wall": 5.0, "cpu": 2.0, suite_profile.LOWER: 0.5,
                suite_profile.CACHE_HIT: 0.25, suite_profile.CACHE_HIT + "#n": 2},
               {"test": "tests/b.py::t3", "wall": 1.0, "cpu": 1.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    totals = suite_profile.summarise(str(path), top=2)
    assert totals["tests"] == 3 and totals["wall"] == 16.0 and totals["cpu"] == 11.0
    assert totals["jit"] == 4.5 and totals["compilations"] == 4 and totals["cache_hits"] == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("3 tests: wall 16 s, cpu 11 s, 4 compilations (2 from the persistent "
                      "cache): compile 3 s, trace 1 s, lower 0 s")
    assert "tests/a.py::t1" in out[3] and "tests/a.py::t2" in out[4]  # by time in jit
    assert out[-3].split() == ["15.0", "wall", "10.0", "cpu", "4.5", "jit", "tests/a.py"]
    assert json.loads(out[-1]) == {"benchmark": "suite_profile", **totals}
