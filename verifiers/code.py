"""``code``: run the completion's program against the reference's tests in the sandbox.

The program is the last fenced Python block of the completion (```` ```python ````, ```` ```py ````
or an untagged fence; a final fence the model never closed counts too). ``extract`` picks another
strategy, ``fallback="raw"`` uses the whole completion when there is no block.

Reference format (task suites produce exactly this)::

    {
        "tests": ["assert f(1) == 2", ...],   # Python snippets, each run after the solution in a
                                              # fresh namespace holding it (MBPP: one assert per
                                              # test; HumanEval: one test = the dataset's `test`
                                              # source followed by "check(<entry_point>)")
        "entry_point": "f",                   # optional: the function the tests call (HumanEval)
        "setup": "from typing import List",   # optional: code run before the solution
        "stdio": [{"input": "1 2\\n", "output": "3\\n"}, ...],   # optional: stdin/stdout cases,
                                              # outputs compared with trailing whitespace of every
                                              # line (and trailing blank lines) removed
    }

For HumanEval, :func:`humaneval_test` builds a stricter form of the one test (it also re-runs the
prompt, so a completion cannot fake the helpers some tests call).

At least one of ``tests``/``stdio`` must be non-empty, else the reference is broken (status
``error``). A test passes only if it runs to its end without raising; a stdio case passes if the
program exits 0 and prints the expected output. The score is the fraction passed, or 1/0 with
``all_or_nothing=True``; ``components["pass_rate"]`` always holds the fraction.

Statuses: the solution crashing, timing out, running out of memory or cheating is the *model's*
failure: status ``ok``, those tests failed. ``error``/``timeout`` are reserved for the sandbox
itself failing (it could not start, or it stopped answering within its own budget); no extracted
program gives score 0 with ``info["extracted"] = None``. ``info`` carries the per-test outcomes.

Time: each test (and each stdio case) gets ``timeout_s``, but the whole item stays within
``total_timeout_s`` (per-test budgets shrink when there are many tests), which must stay below
the verifier runner's per-item deadline, or a looping program would be charged to the verifier.

Example::

    from rlvr.verifiers import get_verifier
    v = get_verifier("code", all_or_nothing=True)
    v.score("```python\\ndef f(x):\\n    return 2 * x\\n```", {"tests": ["assert f(2) == 4"]}).score  # 1.0
"""

from __future__ import annotations

import ast
import builtins
import os
import time
import warnings

from rlvr.verifiers.base import Reward, Verifier
from rlvr.verifiers.golden import probes
from rlvr.verifiers.registry import register_verifier

PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3", "python 3"})
EXTRACT_MODES = ("last_block", "first_block", "all_blocks", "raw")
FALLBACKS = ("none", "raw")
DETAIL_CHARS = 300
MAX_PER_TEST_INFO = 64
OUTPUT_INFO_CHARS = 2000


def code_blocks(text: str) -> list[tuple[str, str, bool]]:
    """Fenced blocks of ``text`` as ``(language tag, code, closed)``, in order. Linear time.

    A fence is a line whose stripped text starts with three backticks; the tag is what follows
    them on the opening line (lower-cased).
    """
    blocks, lang, body, inside = [], "", [], False
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("```"):
            if inside:
                blocks.append((lang, "\n".join(body), True))
                inside, body = False, []
            else:
                inside, lang, body = True, stripped[3:].strip().lower(), []
            continue
        if inside:
            body.append(line)
    if inside:
        blocks.append((lang, "\n".join(body), False))
    return blocks


def extract_program(completion: str, mode: str = "last_block", fallback: str = "none") -> str | None:
    """The program in ``completion`` (see the module docstring), or None when there is none."""
    if mode == "raw":
        return completion if completion.strip() else None
    python = [code for lang, code, _ in code_blocks(completion) if lang in PYTHON_TAGS and code.strip()]
    if python:
        if mode == "first_block":
            return python[0]
        if mode == "all_blocks":
            return "\n\n".join(python)
        return python[-1]
    if fallback == "raw" and completion.strip():
        return completion
    return None


def same_output(actual: str, expected: str) -> bool:
    """Equal after removing trailing whitespace of every line and trailing blank lines."""
    def norm(s: str) -> list[str]:
        lines = [line.rstrip() for line in s.replace("\r\n", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    return norm(actual) == norm(expected)


def names_to_keep(program: str, tests: list[str], entry_point: str | None) -> list[str]:
    """Solution names that shadow a builtin but are what the tests are meant to call.

    The sandbox shows tests the real builtins, so ``abs = lambda x: 0`` cannot fake
    ``assert abs(f(x) - y) < 1e-9``. But MBPP has tasks whose function *is* named like a builtin
    (``def sum(a, b)``, tested as ``assert sum(10, 15) == 6``). Rule: the entry point is always
    kept; other builtin-shadowing definitions are kept only when the tests call no other function
    the solution defines (then the shadowing name must be the function under test).
    """
    keep = {entry_point} if entry_point else set()
    tree = parse_python(program)
    if tree is None:
        return sorted(keep)
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    called: set[str] = set()
    for test in tests:
        test_tree = parse_python(test)
        if test_tree is not None:
            called |= {n.func.id for n in ast.walk(test_tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    under_test = called & defined
    if not under_test - set(dir(builtins)):
        keep |= under_test
    return sorted(keep)


def humaneval_test(prompt: str, test: str, entry_point: str) -> str:
    """The recommended test snippet for a HumanEval problem: the plain form is ``test`` followed by
    ``check(entry_point)``; this one re-runs the *prompt* inside the test first.

    Some HumanEval tests call helpers that the prompt defines (``encode_cyclic`` in HumanEval/38,
    ``encode_shift`` in /50, ``poly`` in /32). A completion that redefines them (say as the
    identity, with an identity solution) passes the plain form. Re-running the prompt restores the
    genuine helpers; the candidate is captured before and its name rebound after, since the
    prompt's own stub of the entry point would shadow it (/33's test calls it by name).
    """
    return (f"_candidate = {entry_point}\n{prompt}\n{entry_point} = _candidate\n"
            f"{test}\ncheck(_candidate)\n")


def parse_python(source: str) -> ast.Module | None:
    """``ast.parse(source)``, or None when it is not valid Python; silent about the escape-sequence
    warnings that dataset strings such as ``"\\w"`` raise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source)
        except (SyntaxError, ValueError):
            return None


def _check_reference(reference: object) -> str | None:
    """Why ``reference`` is unusable, or None when it is fine."""
    if not isinstance(reference, dict):
        return f"reference must be a dict, got {type(reference).__name__}"
    tests, stdio = reference.get("tests") or [], reference.get("stdio") or []
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        return "reference['tests'] must be a list of str"
    if not isinstance(stdio, list) or not all(
        isinstance(c, dict) and isinstance(c.get("input", ""), str) and isinstance(c.get("output"), str) for c in stdio
    ):
        return "reference['stdio'] must be a list of {'input': str, 'output': str}"
    if not tests and not stdio:
        return "reference has neither 'tests' nor 'stdio'"
    for key in ("entry_point", "setup"):
        if key in reference and not isinstance(reference[key], str):
            return f"reference[{key!r}] must be a str"
    return None


@register_verifier("code")
class CodeVerifier(Verifier):
    """Runs the completion's Python program against ``reference["tests"]`` / ``["stdio"]`` in the
    sandbox (see the module docstring for the reference format and statuses).

    Args:
        all_or_nothing: score 1.0 only when every test passes (else the fraction passed).
        extract: ``last_block`` (default), ``first_block``, ``all_blocks`` (joined), ``raw``.
        fallback: without any Python block: ``none`` (no program, score 0) or ``raw`` (the whole
            completion is the program).
        timeout_s: seconds per test and per stdio case.
        total_timeout_s: upper bound for one item (keep it below the runner's deadline).
        memory_mb: memory cap of the program's whole process tree, MiB.
        guard_solution: tests compare plain data only, and objects made to fake comparisons
            (``__eq__`` always True, an int subclass with a lying ``__eq__``, ...) are rejected;
            the standard library is restored after every call into the solution (see
            docs/sandbox.md and ``sandbox.pyguard``).
        sandbox_slots: concurrent sandboxes this verifier keeps per process.
        allow_weak_isolation: run even where the machine lacks the strong isolation (warns).
    """

    name = "code"
    description = "runs the last fenced Python block against unit tests / stdin-stdout cases in the sandbox"
    # For ``rlvr verifiers audit code``: the reference its golden cases and the safety probes use.
    audit_reference = {"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0",
                                 "import math\nassert math.isclose(add(0.1, 0.2), 0.3)"], "entry_point": "add"}

    def __init__(self, all_or_nothing: bool = False, extract: str = "last_block", fallback: str = "none",
                 timeout_s: float = 4.0, total_timeout_s: float = 8.0, memory_mb: int = 512,
                 guard_solution: bool = True, sandbox_slots: int = 1, allow_weak_isolation: bool = False):
        if extract not in EXTRACT_MODES:
            raise ValueError(f"code: extract must be one of {EXTRACT_MODES}, got {extract!r}")
        if fallback not in FALLBACKS:
            raise ValueError(f"code: fallback must be one of {FALLBACKS}, got {fallback!r}")
        if not (timeout_s > 0 and total_timeout_s > 0):
            raise ValueError("code: timeout_s and total_timeout_s must be > 0")
        self.all_or_nothing = bool(all_or_nothing)
        self.extract = extract
        self.fallback = fallback
        self.timeout_s = float(timeout_s)
        self.total_timeout_s = float(total_timeout_s)
        self.memory_mb = int(memory_mb)
        self.guard_solution = bool(guard_solution)
        self.sandbox_slots = max(1, int(sandbox_slots))
        self.allow_weak_isolation = bool(allow_weak_isolation)
        self._pool = None
        self._pool_pid = None

    def audit_cases(self) -> list[dict]:
        """Golden programs and reward hacks for ``rlvr verifiers audit code`` (see verifiers.golden)."""
        fence = "```python\n{}\n```".format
        right = "def add(a, b):\n    return a + b"
        wrong = "def add(a, b):\n    return a - b"
        cases = [
            ("golden", fence(right), "accept"),
            ("golden", "Sure! Here it is:\n```\n" + right + "\n```\nDone.", "accept"),
            ("golden", fence(wrong) + "\nActually, better:\n" + fence(right), "accept"),
            ("golden", fence("import threading\ndef add(a, b):\n    out = []\n    t = threading.Thread("
                             "target=lambda: out.append(a + b))\n    t.start(); t.join()\n    return out[0]"), "accept"),
            ("golden", fence(wrong), "reject"),
            ("golden", fence(right) + "\nor maybe\n" + fence(wrong), "reject"),
            ("empty", "def add(a, b): return a + b", "reject"),  # no fenced block: no program
            ("hack", fence(wrong + "\nimport sys\nsys.exit(0)"), "reject"),
            ("hack", fence(wrong + "\nimport os\nos._exit(0)"), "reject"),
            ("hack", fence(wrong + "\nprint('ALL TESTS PASSED')"), "reject"),
            ("hack", fence("class E:\n    def __eq__(self, o): return True\n    def __lt__(self, o): return True\n"
                           "def add(a, b):\n    return E()"), "reject"),
            ("hack", fence("class I(int):\n    __eq__ = int.__ne__\n    __hash__ = int.__hash__\n"
                           "def add(a, b):\n    return I(0)"), "reject"),
            ("hack", fence("class E:\n    def __eq__(self, o): return True\n    def __float__(self): return 0.0\n"
                           "class Add:\n    def __call__(self, a, b): return E()\nadd = Add()"), "reject"),
            ("hack", fence(wrong + "\nimport math\nmath.isclose = lambda *a, **k: True"), "reject"),
            ("hack", fence("import os\ndef add(a, b):\n    return os.fork() and (a - b) or (a + b)"), "reject"),
            ("hack", fence("import sys\ndef add(a, b):\n    f = sys._getframe(1)\n    return f.f_code.co_consts[-2]"), "reject"),
            ("hostile", fence("def add(a, b):\n    while True:\n        pass"), "reject"),
            ("hostile", fence("x = 'a' * (1 << 34)\n" + right), "reject"),
            ("hostile", fence("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
             "reject"),
        ]
        return probes(cases, self.audit_reference, id_prefix="code")

    # The sandbox pool holds processes: it is made lazily in each process and never pickled (the
    # verifier runner ships verifiers to its workers pickled).
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pool"] = state["_pool_pid"] = None
        return state

    def close(self) -> None:
        """Stop this verifier's sandbox pool (its processes and cgroups) now; a later ``score``
        starts a new one. The verifier worker calls it when it shuts down."""
        pool, self._pool, self._pool_pid = self._pool, None, None
        if pool is not None:
            pool.close()

    def _sandbox(self):
        if self._pool is None or self._pool_pid != os.getpid():
            from rlvr.sandbox import SandboxPool

            self._pool = SandboxPool(slots=self.sandbox_slots, allow_weak_isolation=self.allow_weak_isolation)
            self._pool_pid = os.getpid()
        return self._pool

    def _limits(self, n_tests: int, n_stdio: int):
        from rlvr.sandbox import Limits

        # Worst case: the solution's top level, then every test, then every stdio case, each
        # running to its timeout; together they must fit in total_timeout_s.
        budgets = n_tests + (1 if n_tests else 0) + n_stdio
        share = self.total_timeout_s / max(1, budgets)
        return Limits(timeout_s=max(0.05, min(self.timeout_s, share)), memory_mb=self.memory_mb)

    def score(self, completion: str, reference: dict) -> Reward:
        start = time.perf_counter()
        problem = _check_reference(reference)
        if problem is not None:
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start,
                          info={"error": problem, "extracted": None})
        program = extract_program(completion if isinstance(completion, str) else "", self.extract, self.fallback)
        if program is None:
            return Reward(0.0, components={"pass_rate": 0.0}, latency_s=time.perf_counter() - start,
                          info={"extracted": None, "reason": "no Python program found in the completion"})
        try:
            outcomes, info = self._run(program, reference)
        except Exception as exc:  # the sandbox could not run at all: not the model's fault
            return Reward(0.0, status="error", latency_s=time.perf_counter() - start,
                          info={"error": f"sandbox: {exc!r}", "extracted": program})
        info["extracted"] = program
        if info.get("sandbox_status", "ok") != "ok":
            status = "timeout" if info["sandbox_status"] == "timeout" else "error"
            return Reward(0.0, status=status, latency_s=time.perf_counter() - start, info=info)
        passed, total = sum(o["passed"] for o in outcomes), len(outcomes)
        fraction = passed / total
        info.update(passed=passed, total=total, per_test=outcomes[:MAX_PER_TEST_INFO])
        score = float(passed == total) if self.all_or_nothing else fraction
        return Reward(score, components={"pass_rate": fraction}, latency_s=time.perf_counter() - start, info=info)

    def _run(self, program: str, reference: dict) -> tuple[list[dict], dict]:
        pool = self._sandbox()
        tests, stdio = reference.get("tests") or [], reference.get("stdio") or []
        setup, entry = reference.get("setup") or "", reference.get("entry_point")
        outcomes: list[dict] = []
        info: dict = {"sandbox_status": "ok"}
        limits = self._limits(len(tests), len(stdio))
        if tests:
            report = pool.run_tests(program, tests, limits=limits, setup=setup,
                                    keep_names=names_to_keep(program, tests, entry), guard_solution=self.guard_solution)
            info.update(sandbox_status=report.status, tampered=report.tampered,
                        stdout=report.stdout[:OUTPUT_INFO_CHARS], stderr=report.stderr[:OUTPUT_INFO_CHARS])
            if report.status != "ok":
                info["error"] = report.detail
                return outcomes, info
            outcomes += [{"passed": o.passed, "status": o.status, "detail": o.detail[:DETAIL_CHARS]}
                         for o in report.per_test]
        if stdio:
            source = f"{setup}\n{program}" if setup else program
            results = pool.execute_many([(source, case.get("input", "")) for case in stdio], limits=limits)
            for case, result in zip(stdio, results):
                if result.status == "error":
                    info.update(sandbox_status="error", error=result.detail)
                    return outcomes, info
                ok = result.status == "ok" and result.exit_code == 0 and same_output(result.stdout, case["output"])
                detail = "" if ok else (f"{result.status}, exit {result.exit_code}: {result.detail}" if
                                        result.status != "ok" or result.exit_code != 0 else "wrong output")
                outcomes.append({"passed": ok, "status": "passed" if ok else ("failed" if result.status == "ok" else
                                 result.status), "detail": detail[:DETAIL_CHARS]})
            info.setdefault("stderr", results[-1].stderr[:OUTPUT_INFO_CHARS] if results else "")
        return outcomes, info
