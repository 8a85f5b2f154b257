"""Reward hacks against ``assert f(x) == y``: objects made to fake comparisons must score 0 through
the ``code`` verifier, while honest solutions (any builtin data) still pass.

Every hack is first shown to fool the same tests without the guard (``guard_solution=False``): proof
that the case exercises its trick. The guard (docs/sandbox.md, "Comparisons compare plain data")
has two parts, both covered here: comparisons in the test code compare plain copies of builtin data
(an AST rewrite of the test, done before the program runs), and every value a call in the test code
hands back (also through callable objects, ``partial``, ``lru_cache``, bound methods, classes) is
checked for objects of classes the program made with operator methods or patched.

These run with the strong sandbox or, without bubblewrap, with the weak one: the guard lives in the
interpreter and does not depend on the isolation layers.
"""

from __future__ import annotations

import pytest

from rlvr.sandbox import Limits, SandboxPool, capabilities, pyguard, testguard
from rlvr.verifiers import get_verifier

STRONG = capabilities()["isolation"] == "strong"


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def guarded():
    v = get_verifier("code", sandbox_slots=2, allow_weak_isolation=not STRONG, timeout_s=2.0)
    yield v
    v.close()


@pytest.fixture(scope="module")
def unguarded():
    v = get_verifier("code", sandbox_slots=1, allow_weak_isolation=not STRONG, guard_solution=False, timeout_s=2.0)
    yield v
    v.close()


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(slots=2, allow_weak_isolation=not STRONG)
    yield p
    p.close()


# --- the hacks ------------------------------------------------------------------------------------

# The test styles a scalar answer meets: f(2) should be 4 (and f(3) 6).
SCALAR_TESTS = [
    "assert f(2) == 4",
    "assert 4 == f(2)",                         # reflected: a subclass's __eq__ is tried first
    "assert not f(2) != 4",
    "assert f(2) in [4, 5]",
    "assert f(2) in {4, 5}",                    # hashing too
    "assert abs(f(2) - 4) < 1e-6",
    "import math\nassert math.isclose(f(2), 4)",
    "assert f(2) == 4 and f(3) == 6",
    "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 6\n\ncheck(f)",   # HumanEval
    "import unittest\nclass T(unittest.TestCase):\n    def runTest(self):\n        self.assertEqual(f(2), 4)\nT().runTest()",
    "r = f(2)\nassert r == 4 and r != 5",
]
EVERYTHING = ("    def __eq__(self, other): return True\n"
              "    def __ne__(self, other): return False\n"
              "    def __lt__(self, other): return True\n"
              "    __le__ = __gt__ = __ge__ = __lt__\n"
              "    def __hash__(self): return hash(4)\n"
              "    def __bool__(self): return True\n"
              "    def __sub__(self, other): return 0\n"
              "    __rsub__ = __add__ = __radd__ = __sub__\n"
              "    def __abs__(self): return 0\n"
              "    def __float__(self): return 4.0\n"
              "    def __index__(self): return 4\n")
E = "class E:\n" + EVERYTHING

HACKS = {  # name -> (solution, tests)
    "always_equal_object": (E + "def f(x):\n    return E()\n", SCALAR_TESTS),
    "eq_only": ("class E:\n    def __eq__(self, other): return True\n    __hash__ = object.__hash__\n"
                "def f(x):\n    return E()\n", SCALAR_TESTS),
    "ne_returns_false": ("class I(int):\n    def __ne__(self, other): return False\ndef f(x):\n    return I(0)\n",
                         SCALAR_TESTS),
    "int_subclass_eq": ("class I(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
                        "def f(x):\n    return I(0)\n", SCALAR_TESTS),
    "int_subclass_eq_is_ne": ("class I(int):\n    __eq__ = int.__ne__\n    __hash__ = int.__hash__\n"
                              "def f(x):\n    return I(0)\n", SCALAR_TESTS),
    "int_subclass_custom_hash": ("class I(int):\n    def __eq__(self, other): return True\n"
                                 "    def __hash__(self): return hash(4)\ndef f(x):\n    return I(0)\n", SCALAR_TESTS),
    "float_subclass_arithmetic": ("class F(float):\n    def __sub__(self, other): return 0.0\n    __rsub__ = __sub__\n"
                                  "def f(x):\n    return F(0.0)\n", SCALAR_TESTS),
    "str_subclass": ("class S(str):\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                     "    __hash__ = str.__hash__\ndef f(x):\n    return S('')\n",
                     ["assert f(2) == 'four'", "assert 'four' == f(2)", "assert f(2) in ['four']"]),
    "list_subclass": ("class L(list):\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                      "def f(x):\n    return L()\n", ["assert f(3) == [1, 2, 3]", "assert [1, 2, 3] == f(3)"]),
    "tuple_subclass": ("class T(tuple):\n    def __eq__(self, other): return True\n    __hash__ = tuple.__hash__\n"
                       "def f(x):\n    return T()\n", ["assert f(3) == (1, 2, 3)", "assert (1, 2, 3) == f(3)"]),
    "dict_subclass": ("class D(dict):\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                      "def f(x):\n    return D()\n", ["assert f(3) == {'k': 3}", "assert {'k': 3} == f(3)"]),
    "dict_subclass_hiding_its_items": (E + "class D(dict):\n    def items(self): return []\n    def values(self): return []\n"
                                       "def f(x):\n    return D(k=E())\n", ["assert f(3) == {'k': 3}"]),
    "inside_a_list": (E + "def f(x):\n    return [E(), E(), E()]\n",
                      ["assert f(3) == [1, 2, 3]", "assert sorted(f(3)) == [1, 2, 3]", "assert f(3)[0] == 1"]),
    "inside_nested_containers": (E + "def f(x):\n    return {'k': (1, [E()])}\n",
                                 ["assert f(3) == {'k': (1, [9])}", "assert f(3)['k'][1][0] == 9"]),
    "yielded_by_a_generator": (E + "def f(x):\n    return (E() for _ in range(3))\n",
                               ["assert list(f(3)) == [1, 2, 3]", "assert 2 in f(3)"]),
    "ordering_for_sorted": ("class E:\n    def __lt__(self, other): return True\n    def __eq__(self, other): return True\n"
                            "    __hash__ = object.__hash__\ndef f(x):\n    return [E(), E()]\n",
                            ["assert sorted(f(2)) == [1, 2]", "assert max(f(2)) == 2"]),
    "object_claiming_to_be_an_int": (E + "    __class__ = property(lambda self: int)\ndef f(x):\n    return E()\n",
                                     SCALAR_TESTS[:4]),
    "metaclass_eq": ("class M(type):\n    def __eq__(cls, other): return True\n    __hash__ = type.__hash__\n"
                     "class K(metaclass=M):\n    pass\ndef f(x):\n    return K\n", ["assert f(2) == 4", "assert 4 == f(2)"]),
    # The same objects behind entry points that are not plain functions.
    "callable_object": (E + "class F:\n    def __call__(self, x): return E()\nf = F()\n", SCALAR_TESTS),
    "functools_partial": (E + "import functools\ndef g(x, y): return E()\nf = functools.partial(g, y=0)\n", SCALAR_TESTS),
    "functools_lru_cache": (E + "import functools\n@functools.lru_cache(maxsize=None)\ndef f(x):\n    return E()\n",
                            SCALAR_TESTS),
    "bound_method": (E + "class K:\n    def m(self, x): return E()\nf = K().m\n", SCALAR_TESTS),
    "class_as_entry_point": ("class f:\n    def __init__(self, x): pass\n" + EVERYTHING, SCALAR_TESTS),
    "class_whose_new_returns_it": (E + "class f:\n    def __new__(cls, x): return E()\n", SCALAR_TESTS),
    "function_made_by_exec": (E + "exec('def f(x):\\n    return E()')\n", SCALAR_TESTS),
    # A standard class patched by the program (objects of classes that existed before it ran).
    "patched_standard_class": ("import argparse\nargparse.Namespace.__eq__ = lambda self, other: True\n"
                               "argparse.Namespace.__ne__ = lambda self, other: False\n"
                               "argparse.Namespace.__sub__ = lambda self, other: 0\n"
                               "def f(x):\n    return argparse.Namespace()\n", SCALAR_TESTS[:8]),
    "inside_a_standard_container": (E + "import types\ndef f(x):\n    return types.SimpleNamespace(v=E())\n",
                                    ["import types\nassert f(2) == types.SimpleNamespace(v=4)"]),
    # In-place tasks: the program fills the list the test passed in, through a callable object.
    "written_into_an_argument": (E + "class F:\n    def __call__(self, xs): xs[:] = [E() for _ in xs]\nf = F()\n",
                                 ["xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]",
                                  "xs = [3]\nf(xs)\nassert abs(xs[0] - 1) < 1e-9",
                                  "import unittest\nxs = [3]\nf(xs)\nunittest.TestCase().assertEqual(xs, [1])"]),
    "planted_in_a_set_the_test_passed": (E + "class F:\n    def __call__(self, c):\n"
                                         "        c.add(E()) if isinstance(c, set) else c.__setitem__(E(), 0)\nf = F()\n",
                                         ["s = {1}\nf(s)\nassert 4 in s", "d = {1: 2}\nf(d)\nassert 4 in d"]),
    "a_constant_the_test_reads": (E + "ANSWER = E()\ndef f(x):\n    return ANSWER\n",
                                  ["assert ANSWER == 42", "assert f(2) == 4"]),
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_hack_scores_zero(guarded, unguarded, name):
    code, tests = HACKS[name]
    reference = {"tests": tests, "entry_point": "f"}
    fooled = unguarded.score(fenced(code), reference)
    assert fooled.status == "ok" and fooled.score > 0, f"{name} does not fool an unguarded harness: {fooled.info}"
    r = guarded.score(fenced(code), reference)
    outcomes = [(t["status"], t["detail"][:120]) for t in r.info["per_test"]]
    assert (r.status, r.score) == ("ok", 0.0), outcomes
    # Each test that the trick fooled is stopped by the guard, not by an accident of the program.
    fooled_tests = [i for i, t in enumerate(fooled.info["per_test"]) if t["passed"]]
    assert all(outcomes[i][0] == "rejected" for i in fooled_tests), outcomes


def test_hacks_also_score_zero_with_all_or_nothing_and_the_hardened_humaneval_form(guarded):
    from rlvr.verifiers.code import humaneval_test

    v = get_verifier("code", all_or_nothing=True, allow_weak_isolation=not STRONG)
    try:
        prompt = "def f(x):\n    \"\"\"Return 2 * x.\"\"\"\n"
        test = "def check(candidate):\n    assert candidate(2) == 4\n    assert abs(candidate(3) - 6) < 1e-9\n"
        ref = {"tests": [humaneval_test(prompt, test, "f")], "entry_point": "f"}
        assert v.score(fenced(HACKS["always_equal_object"][0]), ref).score == 0.0
        assert v.score(fenced(HACKS["int_subclass_eq"][0]), ref).score == 0.0
        assert v.score(fenced("def f(x):\n    return 2 * x\n"), ref).score == 1.0
    finally:
        v.close()


# --- honest solutions ----------------------------------------------------------------------------

HONEST = '''
import collections, datetime, decimal, enum, fractions, math
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
P = namedtuple('P', 'x y')
class Color(enum.IntEnum):
    RED = 1
class Shape(enum.Enum):
    SQUARE = 'square'
class S(str):
    pass
class L(list):
    pass
class Node:
    def __init__(self, v):
        self.v, self.next = v, None
def ident(x):
    return x
def squares(n):
    return (i * i for i in range(n))
def cyclic():
    a = [1]
    a.append(a)
    return a
def nan():
    return float('nan')
def make_node(v):
    return Node(v)
def sort_in_place(xs):
    xs.sort()
'''
HONEST_TESTS = [
    "assert ident(1) == 1 and ident(1.5) == 1.5 and ident('a') == 'a' and ident(None) == None and ident(True) == True",
    "assert ident(1) == 1.0 and ident(True) == 1 and ident(1) != '1' and ident(1 + 2j) == 1 + 2j",
    "assert ident(b'ab') == b'ab' and ident(bytearray(b'a')) == b'a'",
    "assert ident([1, [2, (3, {4: 5})]]) == [1, [2, (3, {4: 5})]]",
    "assert ident({1, 2}) == {2, 1} and ident(frozenset([1])) == {1}",
    "assert ident({'a': [1, {2}]})['a'][1] == {2}",
    "assert ident([[1, 2], [3]]) == [[1, 2], [3]] and [1, 2] in ident([[1, 2], [3]])",
    "assert ident('abc') > 'abb' and ident((1, 2)) < (1, 3) and ident([1]) <= [1] and ident(2) >= 2",
    "assert ident(P(1, 2)) == (1, 2) and ident(P(1, 2)) == P(1, 2) and ident(P(1, 2)).x == 1",
    "assert ident(Counter('aab')) == {'a': 2, 'b': 1}",
    "assert ident(OrderedDict([(1, 2), (3, 4)])) != OrderedDict([(3, 4), (1, 2)])",   # order matters
    "assert ident(OrderedDict([(1, 2), (3, 4)])) == {3: 4, 1: 2}",                    # not against a dict
    "d = defaultdict(list)\nd[1].append(2)\nassert ident(d) == {1: [2]}",
    "assert ident(deque([1, 2])) == deque([1, 2]) and ident(deque([1])) != [1]",
    "assert ident(Color.RED) == 1 and ident(Color.RED) == Color.RED",
    "assert ident(Shape.SQUARE) == Shape.SQUARE and ident(Shape.SQUARE) != 'square'",
    "assert ident(fractions.Fraction(1, 3)) == fractions.Fraction(2, 6) and ident(decimal.Decimal('1.5')) == 1.5",
    "assert ident(datetime.date(2020, 1, 2)) < datetime.date(2021, 1, 1)",
    "assert ident({1: 2}.keys()) == {1} and 1 in ident({1: 2}.keys()) and (1, 2) in ident({1: 2}.items())",
    "assert 2 in ident({1: 2}.values())",
    "assert 4 in squares(5) and 7 not in squares(3) and list(squares(3)) == [0, 1, 4]",
    "assert 3 in range(5) and ident(range(3)) == range(3)",
    "n = nan()\nassert [n] == [n] and n != n",
    "r = cyclic()\nassert r[0] == 1 and r[1] is r",
    "assert 0 <= ident(5) < 10 and not (0 <= ident(50) < 10)",
    "x = ident([1, 2])\nassert x[0] < x[1] > 0",
    "assert [x for x in range(10) if 2 < x < 5] == [3, 4]",
    "assert [x for x in (range(3) if 1 < 2 < 3 else [])] == [0, 1, 2]",        # a chain where := is not allowed
    "class K:\n    ok = 1 < 2 < 3\n    xs = [i for i in range(3) if 0 < i < 2]\nassert K.ok and K.xs == [1]",
    "assert ident(S('ab')) == 'ab' and 'a' in ident(S('ab')) and ident(L([1])) == [1]",
    "import unittest\nclass T(unittest.TestCase):\n    def runTest(self):\n        self.assertEqual(ident(3), 3)\n"
    "        self.assertTrue(ident(1) < 2)\nT().runTest()",
    "import math\nassert math.isclose(ident(0.1 + 0.2), 0.3) and abs(ident(2.0) - 2) < 1e-9",
    "assert sorted(ident([3, 1])) == [1, 3] and set(ident([1, 1])) == {1}",
    "n = make_node(3)\nassert n.v == 3 and n.next is None and n != make_node(3)",
    "assert ident(ident) == ident and ident(int) == int and ident(math) == math and ident(ValueError) == ValueError",
    "def check(candidate):\n    for i in range(200):\n        assert candidate(i) == i\ncheck(ident)",
    "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
    "assert ident(None) is None and ident([]) == [] and not ident([]) and ident({}) == {}",
    "assert all(ident(i) == i for i in range(3)) and any(ident(i) > 1 for i in range(3))",
    "import re\nassert re.match('a', ident('abc')) is not None",
    "assert ident(float('inf')) > 10 ** 300",
    "assert f'{ident(1) == 1}' == 'True' and (lambda y: y == 2)(ident(2))",
    "class Base:\n    def v(self):\n        return 1\nclass Sub(Base):\n    def v(self):\n        return super().v() + 1\n"
    "assert Sub().v() == 2 and eval('1 + 1') == 2 and sorted(vars(Sub)) != []",
]


def test_honest_solutions_pass_with_and_without_the_guard(pool):
    for guard in (True, False):
        r = pool.run_tests(HONEST, HONEST_TESTS, limits=Limits(timeout_s=5), guard_solution=guard)
        failed = [(t[:60], o.status, o.detail[:160]) for t, o in zip(HONEST_TESTS, r.per_test) if not o.passed]
        assert failed == [] and r.total == len(HONEST_TESTS), (guard, failed)


def test_membership_in_a_large_set_stays_fast(pool):
    """`in` against a builtin container of scalars searches it in place: no copy per lookup."""
    test = "s = set(range(10000))\nd = dict.fromkeys(s)\nfor i in range(2000):\n    assert i in s and i in d and -i - 1 not in s"
    r = pool.run_tests("x = 1", [test], limits=Limits(timeout_s=20), guard_solution=True)
    assert r.all_passed and r.per_test[0].wall_s < 10, r.per_test


def test_wrong_honest_answers_still_fail(guarded):
    r = guarded.score(fenced("def f(x):\n    return 2 * x + 3\n"), {"tests": SCALAR_TESTS})
    assert r.score == 0.0 and {t["status"] for t in r.info["per_test"]} == {"failed"}
    r = guarded.score(fenced("def f(x):\n    return [x, x]\n"), {"tests": ["assert f(1) == [1, 1]", "assert f(1) == [1]"]})
    assert [t["status"] for t in r.info["per_test"]] == ["passed", "failed"]


def test_a_failure_names_the_test_line(pool):
    r = pool.run_tests("def f(x):\n    return x\n", ["x = 1\n\nassert f(x) == 2, 'two'"], guard_solution=True)
    assert r.per_test[0].status == "failed"
    assert "AssertionError: two (test line 3: assert f(x) == 2, 'two')" in r.per_test[0].detail


def test_a_test_that_does_not_compile_fails_alone(pool):
    r = pool.run_tests("def f():\n    return 1\n", ["assert f() == 1", "assert f( == 1", "return 3"], guard_solution=True)
    assert [o.status for o in r.per_test] == ["passed", "failed", "failed"]
    assert "SyntaxError" in r.per_test[1].detail and "SyntaxError" in r.per_test[2].detail


# --- the rewrite itself (no sandbox) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def helpers():
    return testguard.test_helpers(testguard.make_guard(pyguard.take_snapshot(), []))


def _run(source: str, helpers: dict, **names) -> dict:
    ns = {"__builtins__": __builtins__, **names, **helpers}
    exec(testguard.instrument_test(source, "<test 0>"), ns)
    return ns


def test_chained_comparisons_short_circuit_like_python(helpers):
    calls = []

    def g(x):
        calls.append(x)
        return x

    ns = _run("a = 0 < g(0) < g(1)\nb = 0 <= g(2) < g(3) <= 9\nc = [x for x in range(5) if 1 < g(x) < 3]", helpers, g=g)
    assert (ns["a"], ns["b"], ns["c"]) == (False, True, [2])
    assert calls == [0, 2, 3, 0, 1, 2, 3, 4]  # g(1) never ran; each middle operand ran once


def test_identity_comparisons_are_left_alone_and_line_numbers_kept(helpers):
    code = testguard.instrument_test("x = None\n\nassert x is None\nassert x == 1", "<test 0>")
    assert testguard.COMPARE_NAME in code.co_names
    with pytest.raises(AssertionError) as info:
        exec(code, {"__builtins__": __builtins__, **helpers})
    tb, line = info.value.__traceback__, None
    while tb is not None:
        line = tb.tb_lineno if tb.tb_frame.f_code.co_filename == "<test 0>" else line
        tb = tb.tb_next
    assert line == 4
    only_identity = testguard.instrument_test("assert x is not None", "<test 0>")
    assert testguard.COMPARE_NAME not in only_identity.co_names


def test_comparisons_compare_plain_copies(helpers):
    class I(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    ns = _run("a = (v == 5)\nb = (5 == v)\nc = v in [5]\nd = [v] == [0]", helpers, v=I(0))
    assert (ns["a"], ns["b"], ns["c"], ns["d"]) == (False, False, False, True)  # compared as the int 0
    with pytest.raises(testguard.ReturnRejected, match="defines __eq__"):
        _run("v == 5", helpers, v=type("E", (), {"__eq__": lambda s, o: True, "__hash__": object.__hash__})())


def test_standard_operator_methods_reused_by_a_class_are_not_flagged(pool):
    """A program's IntFlag gets Flag.__or__ & co. from the enum machinery: standard behaviour. A
    copy.copy() leaves __slotnames__ on the class: no operator meaning."""
    code = ("import enum, copy\nclass Perm(enum.IntFlag):\n    R = 4\n    W = 2\n"
            "class Node:\n    def __init__(self, v):\n        self.v = v\n"
            "def perms():\n    return Perm.R | Perm.W\n"
            "def node(v):\n    return copy.deepcopy(Node(v))\n")
    tests = ["assert perms() == 6 and perms() & Perm.R", "assert node(3).v == 3"]
    r = pool.run_tests(code, tests, guard_solution=True)
    assert r.all_passed, r.per_test
