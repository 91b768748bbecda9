"""Where the test suite's time goes: a pytest plugin that records, per test, its wall and CPU
seconds and the sums of jax's monitoring events (compiling, tracing, lowering, persistent
cache hits, checkpoint writes), and a summary of what it recorded (docs/testing.md, "Where the
time goes").

Record (each pytest-xdist worker appends its tests' lines to one file)::

    SUITE_PROFILE=/tmp/profile.jsonl PYTHONPATH=benchmarks pytest -p suite_profile

Summarise (the top events, the slowest tests and modules, and one JSON line)::

    python benchmarks/suite_profile.py /tmp/profile.jsonl [--top=30]

The CPU seconds are this process's (all its threads); commands a test starts are not in them.
"""

import argparse
import collections
import json
import os
import time

import pytest

COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT = "/jax/compilation_cache/cache_retrieval_time_sec"

_events: dict[str, float | int] = {}  # event: seconds, event#n: how many
_listening = []


def _on_event(event: str, seconds: float, **_) -> None:
    _events[event] = _events.get(event, 0.0) + seconds
    _events[event + "#n"] = _events.get(event + "#n", 0) + 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of one test, measured together."""
    if not _listening:
        import jax
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _listening.append(True)
    _events.clear()
    wall, cpu = time.monotonic(), time.process_time()
    yield
    record = {"test": item.nodeid, "wall": time.monotonic() - wall,
              "cpu": time.process_time() - cpu, **_events}
    with open(os.environ.get("SUITE_PROFILE", "suite_profile.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def summarise(path: str, top: int) -> dict:
    """Print the totals, the ``top`` tests by time spent compiling, tracing and lowering, and
    the modules by wall time; return the totals."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for row in rows:  # a record from before CPU seconds were recorded has none
        row.setdefault("cpu", 0.0)
        row["jit"] = sum(row.get(k, 0.0) for k in (COMPILE, TRACE, LOWER))
    totals = {"tests": len(rows), **{k: round(sum(r.get(k, 0.0) for r in rows), 1) for k in (
        "wall", "cpu", "jit", COMPILE, TRACE, LOWER, CACHE_HIT)},
        "compilations": int(sum(r.get(COMPILE + "#n", 0) for r in rows)),
        "cache_hits": int(sum(r.get(CACHE_HIT + "#n", 0) for r in rows))}
    print(f"{totals['tests']} tests: wall {totals['wall']:.0f} s, cpu {totals['cpu']:.0f} s, "
          f"{totals['compilations']} compilations ({totals['cache_hits']} from the persistent "
          f"cache): compile {totals[COMPILE]:.0f} s, trace {totals[TRACE]:.0f} s, "
          f"lower {totals[LOWER]:.0f} s")
    print(f"\nthe {top} tests that spend most in compiling, tracing and lowering:")
    for row in sorted(rows, key=lambda r: -r["jit"])[:top]:
        print(f"{row['wall']:7.1f} wall {row['cpu']:7.1f} cpu {row['jit']:6.1f} jit "
              f"{int(row.get(COMPILE + '#n', 0)):5d} programs  {row['test']}")
    modules = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        module = modules[row["test"].split("::")[0]]
        for i, key in enumerate(("wall", "cpu", "jit")):
            module[i] += row[key]
    print(f"\nthe {top} longest modules:")
    for name, (wall, cpu, jit) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{wall:7.1f} wall {cpu:7.1f} cpu {jit:6.1f} jit  {name}")
    print(json.dumps({"benchmark": "suite_profile", **totals}))
    return totals


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="the file SUITE_PROFILE named")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    summarise(args.path, args.top)
