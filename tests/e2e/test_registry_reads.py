"""How often one `judge()` asks MLflow about a version: each version it reads (the candidate, the fallback and
production baselines) is read once. The real MlflowClient is used; its methods are only wrapped to count calls."""

from __future__ import annotations

import collections
import functools
import subprocess
import sys

from checklists import STAGES
from registry import judge, judge_each
from registry.approvals import sign_off
from tests.support.gate_fixtures import evidence, fresh_registry, register_pair

# every MlflowClient method that returns a model version's tags or aliases, and the read of an evidence run
VERSION_READS = ("get_model_version", "get_model_version_by_alias", "search_model_versions", "get_latest_versions")
RUN_READS = ("get_run",)


def counted(reg) -> collections.Counter:
    """Count every call of the registry's MlflowClient by method name, and version reads by (model, version)."""
    calls: collections.Counter = collections.Counter()
    client = reg.client
    for name in dir(type(client)):
        if name.startswith("_") or not callable(getattr(client, name)):
            continue
        real = getattr(client, name)

        @functools.wraps(real)
        def wrapper(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            if _name in VERSION_READS:
                calls[("version", *map(str, args[:2]))] += 1
            if _name in RUN_READS:
                calls[("run", str(args[0]))] += 1
            return _real(*args, **kwargs)

        setattr(client, name, wrapper)
    return calls


def test_judge_reads_each_version_once(tmp_path):
    reg = fresh_registry(tmp_path)
    v_ar, v = register_pair(reg, evidence())
    sign_off(reg, "tiny-llada", v, "poc", "tooling-maturity", "ada", "tooling checked for poc")
    calls = counted(reg)
    decision = judge(reg, "tiny-llada", v, "poc", record=False)
    assert decision.gate_results  # it judged
    reads = {key: n for key, n in calls.items() if isinstance(key, tuple) and key[0] == "version"}
    print("MLflow calls of one judge():", sum(n for k, n in calls.items() if isinstance(k, str)), dict(calls))
    assert reads == {("version", "tiny-llada", v): 1, ("version", "tiny-ar", v_ar): 1}
    runs = {key: n for key, n in calls.items() if isinstance(key, tuple) and key[0] == "run"}
    assert len(runs) == 2 and set(runs.values()) == {1}  # each version's evidence run, once
    calls.clear()
    judge(reg, "tiny-llada", v, "poc")  # recording the gate report reads no version again
    assert {key: n for key, n in calls.items() if isinstance(key, tuple) and key[0] == "version"} == reads
    calls.clear()
    every = judge_each(reg, "tiny-llada", v, STAGES, record=False)  # the review's three stages: one read
    assert list(every) == list(STAGES) and all(d.gate_results for d in every.values())
    assert {key: n for key, n in calls.items() if isinstance(key, tuple) and key[0] == "version"} == reads
    assert {key: n for key, n in calls.items() if isinstance(key, tuple) and key[0] == "run"} == runs
    assert every["poc"].gate_results == decision.gate_results  # the same verdict as judging the stage alone


def test_the_readers_never_load_the_module_that_moves_aliases():
    code = (
        "import sys, registry.read, registry.views, registry.serving, registry.judging, registry.state; "
        "print(sorted(m for m in sys.modules if m in ('registry.promotion', 'registry.approvals')))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert found.stdout.strip() == "[]"
