"""The guard of the tests (``guard_solution``): comparisons on plain data, returned values checked.

Runs *inside* the sandbox, standard library only, beside :mod:`pyguard` (which keeps the program
out of the harness); this module keeps the program's *objects* from faking a test's verdict (the
"always equal" object). The same rule holds here: no class with Python methods; the guard's
functions are compiled from source into a private namespace (``_GUARD_SOURCE``).
"""

from __future__ import annotations

import ast
import builtins
import collections
import datetime
import decimal
import fractions
import itertools
import operator
import types

from . import pyguard  # relative: the same source runs as rlvr.sandbox.* here and as sandbox.* inside (see launch.py)

# Captured when the zygote loads this module, before any program runs (see pyguard's rule).
_list, _type = list, type

# --- the guard of the tests (``guard_solution``) ---------------------------------------------------
#
# Two checks keep an object built to fake comparisons (the "always equal" object: ``__eq__``
# returns True, or an ``int`` subclass with ``__eq__ = int.__ne__``) from passing a test:
#
# 1. Comparisons in the *test code* are rewritten (:func:`instrument_test`, an AST transform done
#    before any program runs): ``a == b``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in`` and
#    ``not in`` compare *plain data*: fresh copies made only of builtin types (see ``plain`` in
#    _GUARD_SOURCE). A subclass of a builtin type is copied as its base value through the base
#    type's own C methods (a namedtuple as a tuple, an IntEnum member as an int, an int subclass
#    with a lying ``__eq__`` as the int it holds); any other object is compared as is only when
#    no class of it defines a comparison method (then ``==`` is identity); otherwise the test is
#    ``rejected``. The program's code never takes part in the comparison, and the copies are out
#    of reach of its threads.
# 2. Every value a call in the test code returns (``f(x)``, also through a callable object,
#    ``functools.partial``, ``lru_cache``, a bound method, a class) is checked: an object whose
#    class the program made with operator methods, or whose standard class the program patched,
#    is ``rejected`` wherever it hides in builtin containers. This covers what happens to a
#    returned value before it is compared: ``abs(f(x) - y) < 1e-6`` with a lying ``__sub__``,
#    ``sorted(f(x))``, ``unittest``'s ``assertEqual``.

_GUARD_SOURCE = '''
def bad_method(t):
    """(name, note) of the operator method that makes objects of class ``t`` suspect, or None: one
    that a class made after start-up (by the program, or by the test) defines, unless it is the
    very function a standard class has under that name (not for comparisons and __hash__: a
    standard __eq__ written in Python may compare attributes the class redefines), or one that
    the program put on a standard
    class written in Python. Classes written in C cannot be patched."""
    for klass in mro_of(t):
        if not flags_of(klass) & HEAPTYPE:
            continue
        saved = heap_methods.get(oid(klass))
        current = dict_of(klass)
        if saved is not None and saved[0] is klass:
            saved = saved[1]
            for name in current:
                if is_operator(name) and saved.get(name, missing) is not current[name]:
                    return name, " (patched after start-up)"
        else:
            for name in current:
                if is_operator(name) and (name in not_reusable or oid(current[name]) not in std_methods.get(name, ())):
                    return name, ""
    return None


def is_operator(name):
    return type(name) is str and name[:2] == "__" and name[-2:] == "__" and name not in safe


def items_of(value, t):
    """A list of what a builtin container holds, read with the base type's own iteration (never
    an override), or None for anything else."""
    if issubclass(t, dict):
        return list(flatten(dict_items(value)))
    if issubclass(t, list):
        return list_copy(value)
    if issubclass(t, tuple):
        return list(tuple_iter(value))
    if issubclass(t, set):
        return list(set_iter(value))
    if issubclass(t, frozenset):
        return list(frozenset_iter(value))
    if issubclass(t, deque):
        return list(deque_iter(value))
    if t is keys_view or t is values_view or t is items_view:
        return list(flatten(value)) if t is items_view else list(value)
    return None


def check(*values):
    """Raise Rejected if a value, or anything inside builtin containers in it, is an object
    whose class :func:`bad_method` flags. Every item is visited (the test may compare all of
    it), iteratively, each container once; flat containers of scalars cost one C-level pass."""
    stack, seen, good = list(values), set(), set(scalar_ids)
    while stack:
        value = stack.pop()
        t = type(value)
        if oid(t) not in good:
            bad = bad_method(t)
            if bad is not None:
                raise Rejected("the test got a %s object from the program whose class defines %s%s" %
                               (klass_name(t), bad[0], bad[1]))
            good.add(oid(t))
        if oid(value) in seen:
            continue
        items = items_of(value, t)
        if items is None:
            continue
        seen.add(oid(value))
        if set(map(oid, map(type, items))) <= scalar_ids:
            continue
        for item in items:
            if oid(type(item)) not in scalar_ids:
                stack.append(item)


def call(fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` for the test code: the result is checked, and so are the arguments
    afterwards (a call can fill a list the test passed in) unless ``fn`` is written in C."""
    result = fn(*args, **kwargs)
    check(result)
    t = type(fn)
    if oid(t) not in c_callables and not (t is type_type and not flags_of(fn) & HEAPTYPE):
        check(args, kwargs)
    return result


def returned(value):
    """The result of a call that must stay in the test's own frame (``super()``, ``eval``)."""
    check(value)
    return value


def plain(value, memo):
    """``value`` as plain data: a fresh copy made of builtin types only, equal to ``value`` for
    every honest value; raises Rejected for an object that could fake a comparison."""
    t = type(value)
    if oid(t) in scalar_ids:
        return value
    key = oid(value)
    if key in memo:
        return memo[key][1]
    if issubclass(t, int):       # bool cannot be subclassed: an int subclass, an IntEnum member
        return int_copy(value)
    if issubclass(t, float):
        return float_copy(value)
    if issubclass(t, str):
        return str_copy(value)
    if issubclass(t, bytes):
        return bytes_copy(value)
    if issubclass(t, complex):
        return complex_copy(value)
    if issubclass(t, bytearray):
        out = bytearray_copy(value)
        memo[key] = (value, out)
        return out
    if issubclass(t, ordered_dict):
        return copy_pairs(value, list(od_items(value)), ordered_dict, memo)
    if issubclass(t, dict):      # Counter, defaultdict: compared as the dict they hold
        return copy_pairs(value, list(dict_items(value)), dict, memo)
    if issubclass(t, list):
        return copy_items(value, list_copy(value), list, memo)
    if issubclass(t, tuple):     # a namedtuple: compared as a tuple
        return copy_items(value, list(tuple_iter(value)), tuple, memo)
    if issubclass(t, set):
        return copy_items(value, list(set_iter(value)), set, memo)
    if issubclass(t, frozenset):
        return copy_items(value, list(frozenset_iter(value)), frozenset, memo)
    if issubclass(t, deque):
        return copy_items(value, list(deque_iter(value)), deque, memo)
    if t is keys_view:           # set-like: compared as a set
        return copy_items(value, list(value), set, memo)
    if t is items_view:
        return copy_items(value, [(plain(k, memo), plain(v, memo)) for k, v in list(value)], set, memo)
    if oid(t) in value_ids:       # immutable value types of the standard library (C, or unpatched)
        if flags_of(t) & HEAPTYPE and bad_method(t) is not None:
            reject(value, t, bad_method(t)[0])
        if (t is datetime_type or t is time_type) and type(tzinfo_of[t](value)) not in plain_tz:
            reject(value, t, "tzinfo")
        return value
    if t is fraction and bad_method(t) is None and type(numerator_of(value)) is int \\
            and type(denominator_of(value)) is int:
        return value
    for klass in mro_of(t):      # anything else: only if == is identity and ordering fails
        if klass is not object_type:
            d = dict_of(klass)
            for name in comparisons:
                if name in d:
                    reject(value, t, name)
    return value


def reject(value, t, name):
    raise Rejected("compared a %s object whose class defines %s: tests compare plain data only" %
                   (klass_name(t), name))


def copy_items(value, items, make, memo):
    if set(map(oid, map(type, items))) <= scalar_ids:
        out = make(items) if make is not list else items
        memo[oid(value)] = (value, out)
        return out
    if make is list or make is deque:
        out = make()
        memo[oid(value)] = (value, out)   # before the items: a list may hold itself
        for item in items:
            out.append(plain(item, memo))
        return out
    out = make([plain(item, memo) for item in items])
    memo[oid(value)] = (value, out)
    return out


def copy_pairs(value, pairs, make, memo):
    if set(map(oid, map(type, flatten(pairs)))) <= scalar_ids:
        out = make(pairs)
        memo[oid(value)] = (value, out)
        return out
    out = make()
    memo[oid(value)] = (value, out)
    for k, v in pairs:
        out[plain(k, memo)] = plain(v, memo)
    return out


def compare(code, a, b):
    """``a <op> b`` for the test code, on plain copies of both operands."""
    if code >= 6:
        found = contains(b, a)
        return (not found) if code == 7 else found
    memo = {}
    return ops[code](plain(a, memo), plain(b, memo))


def contains(container, item):
    """``item in container`` on plain data. A container that is not plain data (a generator, a
    map, an iterable object) is iterated and each item it yields is compared as plain data; one
    whose class decides membership itself (__contains__) is rejected."""
    wanted = plain(item, {})
    t = type(container)
    if oid(t) in flat_ids and set(map(oid, map(type, container))) <= scalar_ids:
        # A builtin container of scalars only (the common case): its lookup runs no program code,
        # so search it in place: a copy would make a set lookup linear (a 100,000-item set: ms).
        return op_contains(container, wanted)
    if oid(t) in scalar_ids or oid(t) in value_ids or items_of_plain(t):
        return op_contains(plain(container, {}), wanted)
    for klass in mro_of(t):
        if klass is not object_type and "__contains__" in dict_of(klass):
            reject(container, t, "__contains__")
    for x in container:
        got = plain(x, {})
        if got is wanted or got == wanted:
            return True
    return False


def items_of_plain(t):
    return issubclass(t, plain_bases) or t is keys_view or t is items_view


def chain(values, codes):
    """A chained comparison ``a < b < c`` whose operands were all evaluated first (only where the
    short-circuiting form cannot be compiled)."""
    result = True
    for k in range(len(codes)):
        code, a, b = codes[k], values[k], values[k + 1]
        result = (a is b) if code == 8 else (a is not b) if code == 9 else compare(code, a, b)
        if not result:
            return result
    return result


def is_iterator(value):
    return any("__next__" in dict_of(klass) for klass in mro_of(type(value)))


def checked(iterator):
    for item in iterator:
        check(item)
        yield item


def wrap(fn):
    def guarded(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        finally:
            if reached:  # what the call patched must not reach the test's next lines
                restore(snap, reached)
        # The result, and the containers the test passed in (an in-place task could fill them).
        check(result, args, kwargs)
        if oid(type(result)) in known and is_iterator(result):
            return checked(result)  # a generator or map could yield faking objects later
        return result
    guarded.__name__ = fn.__name__
    guarded.__qualname__ = fn.__qualname__
    guarded.__doc__ = fn.__doc__
    guarded.__wrapped__ = fn
    return guarded
'''


_GUARD_CODE = compile(_GUARD_SOURCE, "<test guard>", "exec")
_GUARD_BUILTINS = {name: getattr(builtins, name) for name in (
    "type", "str", "len", "range", "id", "isinstance", "issubclass", "dict", "list", "set", "frozenset",
    "tuple", "any", "map", "iter", "next", "int", "float", "complex", "bytes", "bytearray", "object")}


class ReturnRejected(AssertionError):
    """A value the test got from the program, or compared, is an object built to fake
    comparisons (no methods: see the module docstring)."""


def make_guard(snap: dict, reached: list) -> dict:
    """The guard's functions for one run, built with ``exec`` in a small globals dict of references
    captured now (before any program runs), so that neither the program's patches nor a test
    function's ``__globals__`` lead to the harness:

    ``wrap(fn)``: calls ``fn``, then restores the standard modules the test has reached (the list
    ``reached``, filled by :func:`pyguard.test_namespace` and the test's imports) and checks the result
    and the arguments (``check``); ``compare``, ``chain``, ``returned``: what the code of
    :func:`instrument_test` calls (see the comment at the top of this module).
    """
    type_attr = type.__dict__
    deque = collections.deque
    scalars = (type(None), bool, int, float, complex, str, bytes, range, type(...), type(NotImplemented))
    values = (decimal.Decimal, datetime.date, datetime.datetime, datetime.time, datetime.timedelta,
              datetime.timezone)
    env = {
        "__builtins__": dict(_GUARD_BUILTINS),
        "known": snap["known_types"],
        "heap_methods": snap["heap_methods"],
        "std_methods": snap["std_methods"],
        "HEAPTYPE": pyguard._HEAPTYPE,
        "missing": pyguard._MISSING,
        "mro_of": type_attr["__mro__"].__get__,
        "dict_of": type_attr["__dict__"].__get__,
        "flags_of": type_attr["__flags__"].__get__,
        "klass_name": type_attr["__name__"].__get__,
        "safe": pyguard.SAFE_DUNDERS,
        "object_type": object,
        "oid": pyguard._oid,
        "scalar_ids": frozenset(pyguard._oid(t) for t in scalars),
        "value_ids": frozenset(pyguard._oid(t) for t in values),
        "datetime_type": datetime.datetime, "time_type": datetime.time,
        "tzinfo_of": {datetime.datetime: datetime.datetime.tzinfo.__get__, datetime.time: datetime.time.tzinfo.__get__},
        "plain_tz": (type(None), datetime.timezone),
        "fraction": fractions.Fraction,
        "numerator_of": vars(fractions.Fraction)["_numerator"].__get__,
        "denominator_of": vars(fractions.Fraction)["_denominator"].__get__,
        "comparisons": ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"),
        "not_reusable": frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__"}),
        "deque": deque, "ordered_dict": collections.OrderedDict,
        "keys_view": type({}.keys()), "values_view": type({}.values()), "items_view": type({}.items()),
        "flat_ids": frozenset(pyguard._oid(t) for t in (list, tuple, set, frozenset, dict, type({}.keys()))),
        "plain_bases": (int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset, deque),
        "flatten": itertools.chain.from_iterable,
        "dict_items": dict.items, "od_items": collections.OrderedDict.items, "list_copy": list.copy,
        "tuple_iter": tuple.__iter__, "set_iter": set.__iter__, "frozenset_iter": frozenset.__iter__,
        "deque_iter": deque.__iter__, "int_copy": int.__int__, "float_copy": float.__float__,
        "str_copy": str.__str__, "bytes_copy": bytes.__bytes__, "complex_copy": complex.__complex__,
        "bytearray_copy": bytearray.copy,
        "c_callables": frozenset(pyguard._oid(type(f)) for f in (len, [].append, list.append, object.__init__, (1).__add__,
                                                         dict.fromkeys)),
        "type_type": type,
        "ops": (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge),
        "op_contains": operator.contains,
        "Rejected": ReturnRejected,
        "restore": pyguard.restore_modules,
        "snap": snap,
        "reached": reached,
    }
    exec(_GUARD_CODE, env)
    return {name: env[name] for name in ("wrap", "check", "compare", "chain", "call", "returned")}


def guard_solution_functions(ns: dict, wrap) -> list[str]:
    """Replace, in a test namespace, every function the solution defined by its guarded wrapper."""
    wrapped = []
    for name, value in _list(ns.items()):
        if _type(value) is pyguard._FunctionType and value.__code__.co_filename == pyguard.SOLUTION_FILENAME:
            ns[name] = wrap(value)
            wrapped.append(name)
    return wrapped


# --- the test code's comparisons and calls, rewritten (guard_solution) -----------------------------

COMPARE_NAME, CHAIN_NAME, CALL_NAME, RETURNED_NAME = ("__rlvr_compare__", "__rlvr_chain__", "__rlvr_call__",
                                                     "__rlvr_returned__")
# Builtins that read their caller's frame: their calls stay in the test's frame (result checked).
_FRAME_BUILTINS = frozenset({"super", "locals", "vars", "dir", "globals", "eval", "exec", "breakpoint"})
_OP_CODES = {ast.Eq: 0, ast.NotEq: 1, ast.Lt: 2, ast.LtE: 3, ast.Gt: 4, ast.GtE: 5, ast.In: 6, ast.NotIn: 7,
             ast.Is: 8, ast.IsNot: 9}


def test_helpers(guard: dict) -> dict:
    """The names :func:`instrument_test`'s code calls, for the test's namespace."""
    return {COMPARE_NAME: guard["compare"], CHAIN_NAME: guard["chain"], CALL_NAME: guard["call"],
            RETURNED_NAME: guard["returned"]}


def instrument_test(source: str, filename: str) -> types.CodeType:
    """Compile a test with its comparisons and calls routed through the guard (see the comment
    at the top of this module). Line numbers are kept, so failures still name the test's line. Raises
    what ``compile`` raises for a broken test.

    Runs in the run process before the program starts (``ast`` and ``compile`` are then still
    the interpreter's own). ``a < b < c`` keeps its short-circuit through an assignment
    expression; where one is not allowed (a comprehension's iterable, a class body), all operands
    of that test's chains are evaluated first instead.
    """
    try:
        return compile(_rewrite(compile(source, filename, "exec", ast.PyCF_ONLY_AST), True), filename, "exec")
    except SyntaxError:
        tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST)  # raises for a broken test
        return compile(_rewrite(tree, False), filename, "exec")


def _rewrite(tree: ast.AST, short_circuit: bool) -> ast.AST:
    """Replace every Compare and Call node, children before parents; iterative (deep trees)."""
    order, stack, counter = [], [(tree, None, None, None)], [0]
    while stack:
        node, parent, field, index = stack.pop()
        order.append((node, parent, field, index))
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                stack.extend((item, node, name, i) for i, item in enumerate(value) if isinstance(item, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append((value, node, name, None))
    for node, parent, field, index in reversed(order):
        if isinstance(node, ast.Compare):
            new = _compare(node, short_circuit, counter)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in _FRAME_BUILTINS:
                new = _call(RETURNED_NAME, [node])
            else:
                new = ast.Call(func=ast.Name(id=CALL_NAME, ctx=ast.Load()), args=[node.func, *node.args],
                               keywords=node.keywords)
        else:
            continue
        ast.copy_location(new, node)
        if parent is None:
            continue
        if index is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[index] = new
    return ast.fix_missing_locations(tree)


def _call(name: str, args: list) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=args, keywords=[])


def _compare(node: ast.Compare, short_circuit: bool, counter: list) -> ast.expr:
    codes = [_OP_CODES[type(op)] for op in node.ops]
    if all(code >= 8 for code in codes):  # only `is` / `is not`: identity cannot be faked
        return node
    if len(codes) == 1:
        return _call(COMPARE_NAME, [ast.Constant(codes[0]), node.left, node.comparators[0]])
    if not short_circuit:
        values = ast.Tuple(elts=[node.left, *node.comparators], ctx=ast.Load())
        return _call(CHAIN_NAME, [values, ast.Tuple(elts=[ast.Constant(c) for c in codes], ctx=ast.Load())])
    parts, left = [], node.left
    for k, (op, code, right) in enumerate(zip(node.ops, codes, node.comparators)):
        if k < len(codes) - 1:  # `a < (t := b)` and then `t < c`: b is evaluated once, c only if needed
            counter[0] += 1
            temp = f"__rlvr_t{counter[0]}__"
            right, following = ast.NamedExpr(target=ast.Name(id=temp, ctx=ast.Store()), value=right), temp
        else:
            following = None
        if code >= 8:
            parts.append(ast.Compare(left=left, ops=[op], comparators=[right]))
        else:
            parts.append(_call(COMPARE_NAME, [ast.Constant(code), left, right]))
        if following is not None:
            left = ast.Name(id=following, ctx=ast.Load())
    return ast.BoolOp(op=ast.And(), values=parts)
