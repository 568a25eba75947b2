"""``scramble:``: each rank issues its async ops on different groups, and waits its handles, in
its own order (issue 42, point 5), at collection, on Gloo, and as the fuzzer draws it.

Each test fails without the feature: the key is unknown to the schema, the per-rank orders
would be the program's one order, and the fuzzer would never draw the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

from harness.casefile.scramble import _runs
from harness.fuzz import space
from tests.helpers import case_error, case_instances, load_report, run_pytest, write_case_file

PROGRAM = """
cases:
  - name: two_groups
    world_size: 4
    scramble: SEED
    tensors:
      a: {shape: [8], init: "rank + i"}
      b: {shape: [8], init: "rank * 10 + i"}
      c: {shape: [8], init: "rank * 100 + i"}
      d: {shape: [8], init: "rank + i"}
    steps:
      - {new_group: g1, members: [0, 1, 2, 3]}
      - {new_group: g2, members: [0, 1, 2, 3]}
      - {op: all_reduce, tensor: a, async: true, handle: ha}
      - {op: broadcast, tensor: b, src: 1, group: g1, async: true, handle: hb}
      - {op: all_reduce, tensor: c, group: g2, async: true, handle: hc}
      - {op: all_reduce, tensor: d, group: g2, async: true, handle: hd}
      - {wait: [ha, hb, hc, hd]}
    expected:
      a: "world_size * i + world_size * (world_size - 1) / 2"
      b: "10 + i"
      c: "world_size * i + 100 * world_size * (world_size - 1) / 2"
      d: "world_size * i + world_size * (world_size - 1) / 2"
"""


def _orders(seed: int) -> dict[int, tuple[list[str], list[str]]]:
    (inst,) = case_instances(PROGRAM.replace("SEED", str(seed)))
    out: dict[int, tuple[list[str], list[str]]] = {r: ([], []) for r in range(4)}
    for step in inst.steps:
        if step.kind == "op" and step.handle in ("ha", "hb", "hc"):
            assert step.ranks is not None and len(step.ranks) == 1
            out[step.ranks[0]][0].append(step.handle)
        if step.kind == "wait":
            assert step.ranks is not None and len(step.ranks) == 1
            out[step.ranks[0]][1].extend(step.waits)
    return out


def test_each_rank_issues_and_waits_in_its_own_order_where_the_contract_allows() -> None:
    orders = _orders(7)
    issued = {tuple(o[0]) for o in orders.values()}
    waited = {tuple(o[1]) for o in orders.values()}
    assert len(issued) > 1 and len(waited) > 1  # the ranks disagree on the order
    for mine, waits in orders.values():
        assert sorted(mine) == ["ha", "hb", "hc"] and sorted(waits) == ["ha", "hb", "hc", "hd"]
    (inst,) = case_instances(PROGRAM.replace("SEED", "7"))
    # hd is on g2 like hc: the second op on one group ends the run and stays in place,
    # after hc on every rank, for every rank at once.
    hd = [i for i, s in enumerate(inst.steps) if s.handle == "hd"]
    assert len(hd) == 1 and inst.steps[hd[0]].ranks is None
    assert all(i < hd[0] for i, s in enumerate(inst.steps) if s.handle == "hc")
    assert _orders(7) == orders  # the same seed, the same orders
    assert any(_orders(s) != orders for s in range(1, 6))


def test_runs_never_cross_a_repeated_group_or_a_sync_step() -> None:
    (inst,) = case_instances(PROGRAM.replace("    scramble: SEED\n", ""))
    assert [(s, e) for s, e in _runs(inst.steps)] == [(2, 5), (6, 7)]


def test_scramble_on_the_op_form_or_a_bad_seed_is_a_collection_error() -> None:
    err = case_error("""
    cases:
      - name: s
        op: all_reduce
        world_size: 2
        shape: [4]
        input: "i"
        scramble: 3
    """)
    assert "cases/x.yaml:8:15: at cases[0].scramble: scramble reorders a program" in err, err
    for bad in ("-1", "1.5", "'x'", "99999999999"):
        err = case_error(PROGRAM.replace("SEED", bad))
        assert "cases/x.yaml:5:15: at cases[0].scramble" in err, err


def test_a_scrambled_program_on_two_groups_passes_on_gloo(tmp_path: Path) -> None:
    project = write_case_file(tmp_path, PROGRAM.replace("SEED", "7"))
    done = run_pytest(project, "c.yaml", "-q", "--report-json", "r.json", "--report-md", "r.md",
                      "--report-html", "r.html")
    (rec,) = load_report(project / "r.json")["records"]
    assert rec["outcome"] == "passed", done.stdout[-3000:]


def test_the_fuzzer_draws_scrambled_programs_that_expand() -> None:
    drawn: list[dict[str, Any]] = []

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(space.async_program(3))
    def draw(case: dict[str, Any]) -> None:
        if "scramble" in case:
            drawn.append(case)
            assert len(case_instances(space.render_case(case))) == 1

    draw()
    assert drawn and any(s.get("group") for c in drawn for s in c["steps"])
