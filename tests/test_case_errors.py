"""Every class of malformed case file gets its own message with file:line:col and a fix."""

from __future__ import annotations

import textwrap

import pytest

from harness.casefile import expand, validate
from harness.casefile import load as yamlload
from harness.errors import CaseFileError, CaseFileErrors

from . import helpers as case_helpers

GOOD = """
cases:
  - name: ok
    op: all_reduce
    world_size: 2
    shape: [3]
    input: "rank + i"
"""


def problems(text: str) -> str:
    """Load, validate and expand ``text``; return the rendered error (fail if none)."""
    try:
        doc = yamlload.load_text(textwrap.dedent(text), "cases/x.yaml")
        for case in validate.load_cases(doc):
            expand.expand(case, "gloo")
    except (CaseFileError, CaseFileErrors) as exc:
        return str(exc)
    raise AssertionError("no error raised")


def test_good_file_has_no_problem() -> None:
    doc = yamlload.load_text(GOOD, "cases/x.yaml")
    (case,) = validate.load_cases(doc)
    assert [i.id for i in expand.expand(case, "gloo")] == ["gloo-ws2-float32-sum-sync"]


@pytest.mark.parametrize(("text", "expected"), [
    # unknown key, with a suggestion
    ("""
     cases:
       - name: a
         op: all_reduce
         world_sise: 2
         input: [1]
     """, ["cases/x.yaml:5:5: at cases[0].world_sise: unknown key 'world_sise'",
           "did you mean 'world_size'?"]),
    # misspelled op
    ("""
     cases:
       - name: a
         op: al_reduce
         input: [1]
     """, ["cases/x.yaml:4:9: at cases[0].op: unknown op 'al_reduce'",
           "did you mean 'all_reduce'?"]),
    # a dtype torch does not have
    ("""
     cases:
       - name: a
         op: all_reduce
         dtype: [float32, float33]
         input: [1]
     """, ["cases/x.yaml:5:22: at cases[0].dtype[1]: unknown dtype 'float33'"]),
    # a rank missing from the per-rank inputs
    ("""
     cases:
       - name: a
         op: all_reduce
         world_size: 3
         input: {0: [1], 1: [2]}
     """, ["at cases[0].input: input gives no value for rank(s) 2 at world_size 3",
           "add them, or an 'others:' entry"]),
    # a world size that does not match the per-rank map
    ("""
     cases:
       - name: a
         op: broadcast
         world_size: [2]
         args: {src: 0}
         input: {0: [1], 1: [2], 2: [3]}
     """, ["input names rank 2 but world_size is 2"]),
    # duplicate keys
    ("""
     cases:
       - name: a
         op: all_reduce
         op: broadcast
     """, ["cases/x.yaml:5:5:", "duplicate key 'op' (first defined at line 4)"]),
    # YAML 1.1 booleans
    ("""
     cases:
       - name: a
         op: all_reduce
         async: yes
         input: [1]
     """, ["cases/x.yaml:5:12:", "ambiguous value 'yes'", "write true or false"]),
    # an expression outside the whitelist
    ("""
     cases:
       - name: a
         op: all_reduce
         shape: [2]
         input: "__import__('os').getpid()"
     """, ["at cases[0].input: bad expression", "only these functions may be called"]),
    # an unknown name in an expression
    ("""
     cases:
       - name: a
         op: all_reduce
         shape: [2]
         input: "rnak + i"
     """, ["unknown name 'rnak'", "available here: i, j, k, rank, world_size"]),
    # unknown reduce op
    ("""
     cases:
       - name: a
         op: all_reduce
         reduce_op: summ
         input: [1]
     """, ["unknown reduce op 'summ'", "did you mean 'sum'?"]),
    # an op argument the op does not take, and a missing required one
    ("""
     cases:
       - name: a
         op: broadcast
         args: {dst: 1}
         input: [1]
     """, ["op broadcast needs args.src", "op broadcast takes no argument 'dst'"]),
    # root outside the world
    ("""
     cases:
       - name: a
         op: broadcast
         world_size: 2
         args: {src: 5}
         input: [1]
     """, ["src=5 is outside world_size 2"]),
    # op and steps together / neither
    ("""
     cases:
       - name: a
         world_size: 2
     """, ["needs exactly one of 'op' (one collective) or 'steps' (a program)"]),
    # steps referring to an unknown tensor, and waiting on an unknown handle
    ("""
     cases:
       - name: a
         tensors:
           t: {shape: [2], init: zeros}
         steps:
           - {op: all_reduce, tensor: u}
           - {wait: h}
         expected: {}
     """, ["at cases[0].steps[0].tensor: unknown tensor 'u'", "allowed: t",
           "at cases[0].steps[1].wait: no earlier step has handle 'h'"]),
    # two expectations at once
    ("""
     cases:
       - name: a
         op: all_reduce
         input: [1]
         raises: boom
         hangs: true
     """, ["'raises' and 'hangs' cannot both be expected"]),
    # wrong type, with the expected kinds
    ("""
     cases:
       - name: a
         op: all_reduce
         world_size: two
         input: [1]
     """, ["at cases[0].world_size:", "'two' does not fit here"]),
    # duplicate case names
    ("""
     cases:
       - {name: a, op: barrier}
       - {name: a, op: barrier}
     """, ["duplicate case name 'a' (first at line 3)"]),
    # inputs of different shapes on different ranks
    ("""
     cases:
       - name: a
         op: all_reduce
         input: {0: [1, 2], 1: [1]}
     """, ["per-rank inputs have different shapes"]),
    # keyword in the wrong place
    ("""
     cases:
       - name: a
         op: all_reduce
         shape: [2]
         input: auto
     """, ["'auto' cannot be used here", "allowed: poison, zeros"]),
    # not a case file shape at all
    ("""
     cases: 3
     """, ["cases/x.yaml:2:8: at cases: 3 is not of type array"]),
])
def test_error_classes(text: str, expected: list[str]) -> None:
    message = problems(text)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "Traceback" not in message


def test_all_problems_of_a_file_are_reported_together() -> None:
    message = problems("""
    cases:
      - {name: a, op: al_reduce, input: [1]}
      - {name: b, op: all_reduce, dtype: f32, input: [1]}
    """)
    assert "2 problem(s)" in message
    assert "unknown op 'al_reduce'" in message and "unknown dtype 'f32'" in message


def test_defaults_errors_point_at_the_defaults_block() -> None:
    message = problems("""
    defaults:
      dtype: floaty
    cases:
      - {name: a, op: all_reduce, input: [1]}
    """)
    assert "cases/x.yaml:3:10: at defaults.dtype: unknown dtype 'floaty'" in message


def test_schema_and_other_problems_of_a_file_come_in_one_report() -> None:
    message = problems("""
    cases:
      - {name: a, op: all_reduce, input: [1], tolerence: {atol: 1}}
      - {name: b, op: all_reduce, dtype: f32, input: [1]}
      - {name: c, op: all_reduce, input: "rank +", expected: auto}
    """)
    assert "3 problem(s)" in message, message
    assert "unknown key 'tolerence'" in message and "unknown dtype 'f32'" in message
    assert "bad expression 'rank +'" in message


def test_step_reduce_op_and_premul_expression_are_checked() -> None:
    message = problems("""
    cases:
      - name: p
        world_size: 2
        tensors: {t: {shape: [2], init: "i"}}
        steps:
          - {op: all_reduce, tensor: t, reduce_op: maxx}
          - {op: broadcast, tensor: t, src: 0, reduce_op: sum}
          - {op: all_reduce, tensor: t, premul_factor: "1 / "}
        expected: {t: unspecified}
    """)
    assert "unknown reduce op 'maxx'" in message and "did you mean 'max'" in message
    assert "broadcast does not reduce: 'reduce_op' does not apply" in message
    assert "bad expression '1 / '" in message


def test_premul_factor_expression_per_instance() -> None:
    doc = yamlload.load_text(textwrap.dedent("""
    cases:
      - name: mean
        op: all_reduce
        world_size: [2, 4]
        reduce_op: premul_sum
        args: {premul_factor: "1 / world_size"}
        shape: [2]
        input: "i"
      - name: steps
        world_size: 4
        tensors: {t: {shape: [2], init: "i"}}
        steps:
          - {op: all_reduce, tensor: t, reduce_op: premul_sum, premul_factor: "2 / world_size"}
          - {op: all_reduce, tensor: t, reduce_op: max}
        expected: {t: "i * 2"}
    """), "cases/x.yaml")
    cases = validate.load_cases(doc)
    mean = expand.expand(cases[0], "gloo")
    assert [i.premul_factor for i in mean] == [0.5, 0.25]
    (prog,) = expand.expand(cases[1], "gloo")
    assert [dict(s.args).get("reduce_op") for s in prog.steps] == ["premul_sum", "max"]
    assert dict(prog.steps[0].args)["premul_factor"] == 0.5


# Every kind of name the harness gives expressions: the base names, the fill indices, the
# splits' peers, the repetition, the functions (a name left out of RESERVED_NAMES fails here).
@pytest.mark.parametrize("name", ["rank", "world_size", "i", "j", "k", "src", "dst", "rep",
                                  "where", "min", "max", "abs"])
def test_a_parameter_named_like_a_builtin_name_is_refused_at_its_key(name: str) -> None:
    """Issue 22, point 10: a parameter ``k`` was silently shadowed by the fill index ``k``."""
    text = f"""
    cases:
      - name: shadow
        op: all_reduce
        world_size: 2
        params: {{{name}: [1, 2]}}
        shape: [4]
        input: "i"
    """
    msg = case_helpers.case_error(text)
    assert (f"\ncases/x.yaml:6:14: at cases[0].params.{name}: params: '{name}' is a name the "
            "harness itself gives expressions") in msg, msg


def test_a_parameter_with_another_name_is_fine() -> None:
    (inst, _) = case_helpers.case_instances("""
    cases:
      - name: fine
        op: all_reduce
        world_size: 2
        params: {kk: [1, 2]}
        shape: [4]
        input: "i * kk"
    """)
    assert dict(inst.params) == {"kk": 1}


def test_every_typo_of_a_case_is_reported_in_one_pass() -> None:
    """Issue 26, point 3: unknown keys no longer hide the case's other problems."""
    msg = case_helpers.case_error("""
    cases:
      - name: a
        op: all_reduc
        wrld_size: 2
        dtype: flaot32
        shape: [4]
        input: "i +"
        expcted: [1, 2, 3, 4]
    """)
    assert msg.startswith("5 problem(s) in case file cases/x.yaml:"), msg
    for where, says in [("4:9", "unknown op 'all_reduc'"), ("5:5", "unknown key 'wrld_size'"),
                        ("6:12", "unknown dtype 'flaot32'"), ("8:12", "bad expression 'i +'"),
                        ("9:5", "unknown key 'expcted'")]:
        assert f"cases/x.yaml:{where}: " in msg and says in msg, (where, msg)
    assert "did you mean 'world_size'?" in msg and "did you mean 'expected'?" in msg


def test_a_builtin_name_under_defaults_is_refused_once_at_its_key() -> None:
    msg = case_helpers.case_error("""
    defaults:
      params: {rep: [1, 2]}
    cases:
      - {name: a, op: all_reduce, world_size: 2, shape: [4], input: "i"}
      - {name: b, op: all_reduce, world_size: 2, shape: [4], input: "i"}
    """)
    assert msg.startswith("1 problem(s)"), msg
    assert "cases/x.yaml:3:12: at defaults.params.rep: params: 'rep' is a name" in msg, msg


def test_every_name_the_harness_gives_expressions_is_reserved() -> None:
    """The reserved list cannot drift from what the evaluator and the scopes provide: the
    named constants, and every key a scope adds to an expression's environment in the
    harness's sources (``{**env, "NAME": ...}``)."""
    import re
    from pathlib import Path

    from harness.casefile.entries import ENTRY_NAMES
    from harness.casefile.fields import BASE_NAMES, RESERVED_NAMES
    from harness.casefile.opargs import SPLIT_NAMES
    from harness.casefile.repeat import REP_NAME
    from harness.casefile.validate import OVERRIDE_NAMES
    from harness.expr import FUNCTIONS

    given = {*BASE_NAMES, *ENTRY_NAMES, *SPLIT_NAMES, REP_NAME, *OVERRIDE_NAMES, *FUNCTIONS,
             "i", "j", "k"}
    root = Path(__file__).resolve().parent.parent / "harness"
    for path in root.rglob("*.py"):
        for scope in re.findall(r"\{\*\*env,([^{}]*)\}", path.read_text()):
            given.update(re.findall(r'"([A-Za-z_]\w*)":', scope))
    assert given >= {"rank", "world_size", "rep", "src", "dst", "j"}  # the scan finds scopes
    assert given <= set(RESERVED_NAMES), given - set(RESERVED_NAMES)


def p2p_program(steps: str, extra: str = "", world_size: int = 2) -> str:
    return f"""
cases:
  - name: p
    world_size: {world_size}
    tensors: {{t: {{shape: [2], init: "rank"}}}}
{extra}    steps:
{steps}    expected: {{t: "rank"}}
"""


def test_a_recv_without_its_send_is_an_error_at_the_step() -> None:
    """Issue 43.6: a recv whose peer never sends was found only at the deadline, with the
    case's line; it is visible in the file, so it is an error at collection, at the step."""
    err = problems(p2p_program("      - {op: all_reduce, tensor: t}\n"
                               "      - {op: recv, tensor: t, src: 0, ranks: [1]}\n"))
    assert err.startswith("cases/x.yaml:8:9: at cases[0].steps[1]: no matching send for this "
                          "receive at world size 2: rank 1 receives from rank 0 (tag 0) 1 "
                          "time(s), rank 0 sends to rank 1 with that tag 0 time(s); rank 1 "
                          "would block until the deadline"), err
    assert "add the send on rank 0 (dst 1, tag 0), or declare the hang with 'hangs: true'" in err


@pytest.mark.parametrize(("steps", "message"), [
    # a send nobody receives, at the send
    ("      - {op: send, tensor: t, dst: 1, ranks: [0]}\n",
     "cases/x.yaml:7:9: at cases[0].steps[0]: no matching receive for this send at world size 2:"
     " rank 0 sends to rank 1 (tag 0) 1 time(s), rank 1 receives from rank 0 with that tag 0"),
    # tags differ
    ("      - {op: send, tensor: t, dst: 1, tag: 1, ranks: [0]}\n"
     "      - {op: recv, tensor: t, src: 0, tag: 2, ranks: [1]}\n",
     "at cases[0].steps[0]: no matching receive for this send at world size 2: rank 0 sends "
     "to rank 1 (tag 1)"),
    # a ring one rank short: rank 2 (of 3) receives from rank 1, which sends to nobody
    ("      - {op: isend, tensor: t, dst: \"rank + 1\", ranks: \"rank < 1\", handle: s}\n"
     "      - {op: irecv, tensor: t, src: \"rank - 1\", ranks: \"rank > 0\", handle: r}\n"
     "      - {wait: s, ranks: [0]}\n      - {wait: r, ranks: [1, 2]}\n",
     "at cases[0].steps[1]: no matching send for this receive at world size 3: rank 2 receives "
     "from rank 1 (tag 0) 1 time(s), rank 1 sends to rank 2 with that tag 0 time(s)"),
    # a batch whose receive has no send; repeated receives count one each
    ("      - op: batch_isend_irecv\n        p2p:\n"
     "          - {op: irecv, tensor: t, peer: \"1 - rank\"}\n        handle: b\n"
     "      - {wait: b}\n",
     "at cases[0].steps[0]: no matching send for this receive at world size 2: rank 0 receives "
     "from rank 1"),
    ("      - {op: send, tensor: t, dst: 1, ranks: [0]}\n"
     "      - {op: recv, tensor: t, src: 0, ranks: [1], repeat: 2}\n",
     "at cases[0].steps[1]: no matching send for this receive at world size 2: rank 1 receives "
     "from rank 0 (tag 0) 2 time(s), rank 0 sends to rank 1 with that tag 1 time(s)"),
])
def test_unmatched_point_to_point_messages_are_named(steps: str, message: str) -> None:
    world_size = 3 if "rank + 1" in steps else 2
    assert message in problems(p2p_program(steps, world_size=world_size))


@pytest.mark.parametrize(("steps", "extra"), [
    # matched: a ring in both directions, a batch, a group given as a list (by position)
    ("      - {op: isend, tensor: t, dst: \"(rank + 1) % world_size\", handle: s}\n"
     "      - {op: irecv, tensor: t, src: \"(rank - 1) % world_size\", handle: r}\n"
     "      - {wait: [s, r]}\n", ""),
    ("      - {op: send, tensor: t, group: [0, 1], group_dst: 1, ranks: [0]}\n"
     "      - {op: recv, tensor: t, src: 0, ranks: [1]}\n", ""),
    # declared: the hang, or an error
    ("      - {op: recv, tensor: t, src: 0, ranks: [1]}\n", "    hangs: true\n    deadline: 2\n"),
    ("      - {op: recv, tensor: t, src: 0, ranks: [1], raises: timed out}\n", ""),
    # not static: a receive from any rank (the hang names the step and the peer instead)
    ("      - {op: recv, tensor: t, ranks: [1]}\n", ""),
])
def test_matched_declared_or_unknown_messages_are_accepted(steps: str, extra: str) -> None:
    text = p2p_program(steps, extra)
    doc = yamlload.load_text(textwrap.dedent(text), "cases/x.yaml")
    assert [i.id for c in validate.load_cases(doc) for i in expand.expand(c, "gloo")]


TABLES = """
cases:
  - name: t
    op: all_to_all_single
    world_size: 2
{tables}    args: {{splits: "routes[src][dst]"}}
    shape: [4]
    input: "i"
"""


def test_a_table_of_split_sizes_gives_each_instance_its_splits() -> None:
    """Issue 43.7: per-rank split sizes from a routing table, indexed in an expression."""
    (inst,) = case_helpers.case_instances(TABLES.format(
        tables="    tables:\n      routes: [[1, 3], [2, 2]]\n"))
    assert dict(inst.steps[0].args)["splits"] == ((1, 3), (2, 2))


@pytest.mark.parametrize(("tables", "message"), [
    ("    params: {routes: [1]}\n    tables:\n      routes: [[1, 3], [2, 2]]\n",
     "cases/x.yaml:8:7: at cases[0].tables.routes: tables: 'routes' is a param of this case"),
    ("    tables:\n      src: [[1, 3], [2, 2]]\n",
     "tables: 'src' is a name the harness itself gives expressions"),
    ("    tables:\n      routes: [[[[[1]]]]]\n",
     "tables: 'routes' is larger than a table may be (65,536 numbers, 4 levels of lists)"),
    ("    tables:\n      routes: [[1, 3]]\n",
     "at cases[0].args.splits: bad splits: index 1 is out of range 0..0 of 'routes'"),
    ("    tables:\n      routes: [[1, 3], [2, \"x\"]]\n", "at cases[0].tables.routes"),
])
def test_bad_tables_are_located_errors(tables: str, message: str) -> None:
    assert message in problems(TABLES.format(tables=tables))


SAME_VALUES = """
cases:
  - name: p
    world_size: 2
    tensors:
      flat: {{shape: [4], init: "rank + i"}}
      hier: {{shape: [4], init: "rank + i"}}
      objs: {{dtype: object, shape: [1], init: poison}}
    steps:
      - {{op: all_reduce, tensor: flat}}
      - {{op: all_reduce, tensor: hier}}
    expected:
{expected}"""


@pytest.mark.parametrize(("expected", "message"), [
    ("      hier: {same_values: flt}\n", "cases/x.yaml:13:27: at cases[0].expected.hier."
     "same_values: same_values names 'flt', which is not a tensor of the program"),
    ("      hier: {same_values: hier}\n", "same_values names 'hier', the buffer itself"),
    ("      hier: {same_values: objs}\n", "same_values names 'objs', an object buffer"),
    ("      hier: {same_values: flat, rtol: .inf}\n", "rtol must be a finite number >= 0"),
    ("      hier: {same_values: flat, tol: 1}\n", "at cases[0].expected.hier"),
])
def test_bad_same_values_are_located_errors(expected: str, message: str) -> None:
    assert message in problems(SAME_VALUES.format(expected=expected))


def test_same_values_is_a_programs_expectation() -> None:
    err = problems(GOOD.replace('input: "rank + i"',
                                'input: "rank + i"\n    expected: {same_values: x}'))
    assert "same_values compares two buffers of a program" in err


def test_same_values_compares_with_its_own_tolerance_and_counts_both_buffers() -> None:
    (inst,) = case_helpers.case_instances(SAME_VALUES.format(
        expected="      hier: {same_values: flat, rtol: 1.0e-5}\n"))
    fill = dict(inst.expected)["hier"]
    assert fill.kind == "same_values" and fill.data[0] == "flat"
    assert fill.data[1].rtol == 1e-5 and fill.data[1].atol == 0
    assert inst.unchecked == ()  # flat is compared too: neither is reported unchecked
