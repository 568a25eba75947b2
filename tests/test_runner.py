"""The runner: one path from an instance to its verdict for every front end.

An internal error discards exactly the pool the instance ran on (its key carries the case's
environment and device binding), and the fuzzer judges a document as pytest judges the case
file it writes, ordering probes included.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

import harness.runner.execute as execute
from harness.casefile import collect
from harness.fuzz.execute import Executor
from harness.model import Instance, PoolRun
from harness.run.capabilities import Capabilities
from harness.run.pool import PoolKey
from harness.runner.execute import Runner
from harness.runner.prepare import Prepared, pool_key
from harness.runner.settings import RunSettings

from .helpers import HANG_S, PYTHON, subprocess_env

ENV_CASE = """
cases:
  - name: lazy
    op: all_reduce
    world_size: 2
    backends: [gloo]
    env: {TORCH_GLOO_LAZY_INIT: 1}
    pg_timeout: 30
    shape: [2]
    input: "rank + i"
"""


class FakePool:
    def __init__(self, key: PoolKey) -> None:
        self.key = key
        self.killed = False

    def run(self, inst: Instance, deadline_s: float, on_wait: Any = None) -> PoolRun:
        return PoolRun(kind="done", results={})

    def kill(self) -> None:
        self.killed = True


class FakeManager:
    """Records which pools were fetched and which were discarded."""

    def __init__(self) -> None:
        self.got: list[PoolKey] = []
        self.discarded: list[PoolKey] = []
        self.pools: list[FakePool] = []

    def get(self, key: PoolKey) -> FakePool:
        self.got.append(key)
        self.pools.append(FakePool(key))
        return self.pools[-1]

    def isolated(self, key: PoolKey) -> FakePool:
        return self.get(dataclasses.replace(key, isolated=len(self.pools) + 1))

    def discard(self, key: PoolKey) -> None:
        self.discarded.append(key)

    def settle(self, pool: FakePool, inst: Instance, run: PoolRun) -> str:
        return ""


def _instance(bind_device: bool = False, isolate: bool = False) -> Instance:
    (inst,) = collect.from_text(textwrap.dedent(ENV_CASE), "c.yaml", "gloo")
    return dataclasses.replace(inst, bind_device=bind_device, isolate=isolate)


def _runner(manager: FakeManager) -> Runner:
    runner = Runner(RunSettings(backend_modules=("mod",)), caps=Capabilities())
    runner._manager = manager  # type: ignore[assignment]
    return runner


@pytest.mark.parametrize("bind_device", [False, True])
def test_an_internal_error_discards_the_pool_it_ran_on(monkeypatch: pytest.MonkeyPatch,
                                                       bind_device: bool) -> None:
    """Before the runner, the plugin discarded a key without the case's env, process-group
    timeout and device binding: the pool in an unknown state stayed in use."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected judge failure")

    monkeypatch.setattr(execute, "judge", broken)
    manager = FakeManager()
    inst = _instance(bind_device)
    judged = _runner(manager).execute(Prepared(inst, 5.0))
    assert judged.result.outcome == "error"
    assert judged.result.harness_error is not None
    assert judged.result.harness_error["stage"] == "running or judging"
    (used,) = manager.got
    assert used.env == (("TORCH_GLOO_LAZY_INIT", "1"),) and used.pg_timeout_s == 30
    assert used.bind_device is bind_device and used.backend_modules == ("mod",)
    assert manager.discarded == [used]  # exactly the pool it ran on


def test_an_internal_error_on_an_isolated_pool_kills_it(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(execute, "judge", lambda *a, **k: 1 / 0)
    manager = FakeManager()
    judged = _runner(manager).execute(Prepared(_instance(isolate=True), 5.0))
    assert judged.result.outcome == "error" and manager.discarded == []
    assert manager.pools[0].killed  # a private pool nobody else would stop


def test_the_pool_key_is_built_from_the_instance_alone() -> None:
    inst = _instance(bind_device=True)
    settings = RunSettings(backend_modules=("m",), env=(("TORCH_DISTRIBUTED_DEBUG", "OFF"),))
    key = pool_key(inst, settings)
    assert key == PoolKey("gloo", inst.device, 2, ("m",),
                          env=(("TORCH_DISTRIBUTED_DEBUG", "OFF"), ("TORCH_GLOO_LAZY_INIT", "1")),
                          pg_timeout_s=30, bind_device=True)


def test_an_unusable_deadline_never_reaches_a_pool() -> None:
    manager = FakeManager()
    runner = _runner(manager)
    prepared = runner.prepare(dataclasses.replace(_instance(), deadline=float("inf")))
    judged = runner.execute(prepared)
    assert judged.result.outcome == "error" and "set `deadline:`" in judged.result.message
    assert manager.got == []


ASYNC_DOC = """
cases:
  - name: fuzz
    op: all_reduce
    world_size: 2
    async: true
    shape: [64]
    input: "rank * 3 + i"
    expected: auto
    deadline: 5
"""


def test_the_fuzzer_judges_a_document_as_pytest_judges_its_case_file(tmp_path: Path) -> None:
    """A backend whose wait() returns early: the values end right, the delayed probes see the
    early read. The fuzzer's probed document and pytest on the same text with every probe
    (what a probed document is) fail it alike, naming the post_wait probe; unprobed, the
    fuzzer has no post_wait verdict to give."""
    text = textwrap.dedent(ASYNC_DOC)
    # Through the ranks' environment (set before init), not this process's: a forkserver
    # an earlier test started would not see a variable set now.
    ex = Executor("faulty_ordering", ("tests.ordering_fault_backend",), deadline_s=5.0,
                  probe_every=1, env=(("COLLECTIVE_FAULT", "early_wait"),))
    try:
        probed = ex.run_text(text)
        (inst,) = ex.instances(text)
        unprobed = ex.run_instance(inst, probes=False)
    finally:
        ex.close()
    (tmp_path / "c.yaml").write_text(text)
    res = subprocess.run(
        [PYTHON, "-m", "pytest", "c.yaml", "-q", "-p", "no:cacheprovider", "--ordering", "all",
         "--backend-module", "tests.ordering_fault_backend", "--backend", "faulty_ordering",
         "--report-json", "r.json", "--report-md", "r.md", "--report-html", "r.html"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S,
        env=subprocess_env(COLLECTIVE_FAULT="early_wait"))
    (record,) = json.loads((tmp_path / "r.json").read_text())["records"]
    assert record["outcome"] == probed.outcome == "failed", res.stdout[-2000:]
    assert "post_wait" in probed.message and "post_wait" in record["message"]
    assert "post_wait" not in unprobed.message  # only the probes check it
