"""Interpreter-level guard: keeps a program from reaching into the test harness that runs it.

Runs *inside* the sandbox, standard library only. Tests must run in the program's own interpreter
(they call its functions), so a program that can walk interpreter frames or raw memory could read
the harness's nonce, read the expected values out of the test's code, or rewrite the test. The
kernel layers (``sandbox.guard``) take away memory access from outside (``ptrace``,
``process_vm_*``, ``/proc/<pid>/mem``) and new signal handlers (whose frame argument is a way in).
This module closes the in-process ways in:

* an audit hook (PEP 578; it cannot be removed once added) refuses ``sys._getframe``,
  ``tb_frame``/``gi_frame``/``cr_frame``/``ag_frame``, ``sys._current_frames``, ``gc`` object walks,
  ``sys.settrace``/``setprofile`` (a tracer can jump over an ``assert``), every ``ctypes`` call,
  new audit hooks, new code objects (``code.__new__``, ``__code__`` rebinding, ``marshal.loads``
  outside the import system), reading ``__code__`` of test functions, and imports of the CPython
  test extensions and ``cffi``;
* :func:`test_namespace` gives each test a copy of the solution's namespace in which names that
  shadow builtins or standard modules point at the real ones again (``abs = lambda x: 0``), a
  private copy of the builtins (so ``builtins.abs = ...`` cannot reach the test), and an
  ``__import__`` that hands the test every standard module as it was in the zygote;
  :func:`restore_modules` does the putting back (``math.isclose = lambda *a: True``, a fake
  ``sys.modules['math']``, ``unittest.TestCase.assertEqual = ...``);
* with ``guard_solution`` (:func:`make_guard`, :func:`instrument_test`): the test's comparisons
  compare plain data (copies made of builtin types), every value a call in the test returns is
  checked for objects of classes the program made with operator methods or patched (the "always
  equal" object), and the solution's functions the tests call are wrapped: after each call the
  modules the test reached are restored again (patches made *during* a call cannot fake the
  test's next lines).

What remains is documented in docs/sandbox.md: exploiting CPython memory-safety bugs, and
semantic tricks inside the program's own classes that tests call directly.

Rule for every module that runs inside (guard, pyguard, harness, zygote): define no class with
Python methods, and keep run secrets (nonce, result writer, hook controls) in local variables.
``object.__subclasses__()`` reaches every class, a method's ``__globals__`` reaches its module, and
from there a program could swap the functions the harness calls; with frames refused, locals and
closures are out of reach.
"""

from __future__ import annotations

import ast
import builtins
import collections
import datetime
import decimal
import fractions
import gc
import itertools
import operator
import sys
import types

# Captured at import, in the zygote, before any program ran. Code here that runs after a program
# (restores, the test namespace, the audit hook) must not look up a builtin or a module attribute
# the program may have replaced (``builtins.isinstance = ...``, ``types.ModuleType = int``,
# ``sys.modules = {}``): module globals of this file are out of the program's reach, builtins
# and other modules' attributes are not.
_dict, _list, _len, _id, _any, _type, _str, _exec = dict, list, len, id, any, type, str, exec
_ValueError, _AttributeError, _PermissionError, _ImportError = ValueError, AttributeError, PermissionError, ImportError
_FunctionType = types.FunctionType
# Identity of an object as an int, like id() but without id()'s audit event (the sandbox's audit
# hook is Python code: id() in a loop over 100,000 items cost 28 ms there instead of 3.6 ms).
# object.__hash__ is the pointer rotated by 4 bits: distinct for distinct live objects.
_oid = object.__hash__
_sys_modules, _builtins_dict = sys.modules, builtins.__dict__
_type_dict = type.__dict__["__dict__"].__get__
_type_setattr, _type_delattr = type.__setattr__, type.__delattr__
_TINY_BUILTINS = {"type": type, "str": str, "len": len, "range": range, "id": id, "isinstance": isinstance,
                  "dict": dict, "list": list, "set": set, "any": any}

SOLUTION_FILENAME = "<solution>"
TEST_FILENAME_PREFIX = "<test"

_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_DENIED_EVENTS = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys._current_exceptions",
    "code.__new__",
})
_DENIED_IMPORT_PREFIXES = (
    "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase", "_testimportmultiple",
    "_testclinic", "_testsinglephase", "_ctypes_test", "_xxtestfuzz", "_xxsubinterpreters",
    "_xxinterpchannels", "xxlimited", "xxsubtype", "_cffi_backend", "cffi",
)


class _HookRefused(RuntimeError):
    """Raised by the audit hook for ``sys.addaudithook``: CPython then silently drops the new hook."""


# Modules whose *classes* tests lean on (unittest assertions, collection types, numbers): their
# class dicts are restored too, when the test reaches the module.
CLASS_MODULES = (
    "unittest.case", "unittest.suite", "unittest.loader", "unittest.result", "unittest.runner",
    "collections", "numbers", "fractions", "enum", "json.encoder", "json.decoder", "statistics",
)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: classes written in Python (their dicts can be patched)
_MISSING = object()


def take_snapshot() -> dict:
    """The zygote's pristine interpreter state, taken once after the preimports.

    ``modules``: sys.modules as it was (minus the sandbox's own modules and ``__main__``);
    ``dicts``: a shallow copy of each module's namespace; ``builtins``: the builtins namespace;
    ``classes``: module name -> [(class, copy of its __dict__)] for :data:`CLASS_MODULES`;
    ``known_types``: identities (``object.__hash__``) of every class that existed (so a class made later was made by a program),
    ``known_refs`` keeps those classes alive (an id must never be reused by a later class);
    ``heap_methods``: id -> (class, its operator methods) for every class written in Python among
    them, so that a program that patches one (``argparse.Namespace.__eq__ = ...``) is noticed.
    ``std_methods``: operator method name -> ids of the functions standard classes use under that
    name (a class that only reuses them, e.g. an IntFlag's ``__or__ = Flag.__or__``, behaves like a
    standard one).
    A plain dict on purpose: see the module docstring on why nothing here is a class with methods.
    """
    modules = {name: mod for name, mod in sys.modules.items()
               if isinstance(mod, types.ModuleType) and name != "__main__"
               and name != "sandbox" and not name.startswith("sandbox.")}
    known: set[int] = set()
    refs: list = []
    heap: dict[int, tuple] = {}
    std: dict[str, set] = {}
    stack = [object]
    while stack:
        cls = stack.pop()
        if _oid(cls) not in known:
            known.add(_oid(cls))
            refs.append(cls)
            stack.extend(type.__subclasses__(cls))
            methods = {k: v for k, v in vars(cls).items() if _is_operator_name(k)}
            for name, value in methods.items():
                std.setdefault(name, set()).add(_oid(value))
            if cls.__flags__ & _HEAPTYPE:
                heap[_oid(cls)] = (cls, methods)  # also keeps the values (and their ids) alive
    classes: dict[str, list] = {}
    for name in CLASS_MODULES:
        for value in vars(modules[name]).values() if name in modules else ():
            if isinstance(value, type) and value.__module__ == name and value.__flags__ & _HEAPTYPE:
                classes.setdefault(name, []).append((value, dict(value.__dict__)))
    return {
        "modules": modules,
        "dicts": {name: dict(mod.__dict__) for name, mod in modules.items()},
        "ids": {id(mod): name for name, mod in modules.items()},
        "builtins": dict(builtins.__dict__),
        "classes": classes,
        "known_types": frozenset(known),
        "known_refs": tuple(refs),
        "heap_methods": heap,
        "std_methods": {name: frozenset(ids) for name, ids in std.items()},
    }


def restore_modules(snap: dict, only=None) -> int:
    """Undo what a program did to shared interpreter state; returns how many entries were reset.

    ``only=None``: every ``sys.modules`` entry, module attribute, builtin and class of
    :data:`CLASS_MODULES`. Otherwise just the modules named in ``only`` (their ``sys.modules``
    entry, their attributes, and the classes of the CLASS_MODULES at or below them). A restore
    touches every value it checks, and in a freshly forked process each touch costs a
    copy-on-write page fault (~6 ms for everything, far less for a few modules): tests restore
    only the modules they can reach.

    Only identity changes are undone: caches that modules mutate in place (``re._cache``) stay.
    Module attributes a program *added* stay (harmless); class attributes it added are removed.
    """
    fixed = 0
    modules, dicts = snap["modules"], snap["dicts"]
    names = modules if only is None else [n for n in only if n in modules]
    for name in names:
        mod = modules[name]
        if _sys_modules.get(name) is not mod:
            _sys_modules[name] = mod
            fixed += 1
        d = mod.__dict__  # a real module (ModuleType is a static type: its __dict__ is fixed)
        for key, value in dicts[name].items():
            if d.get(key, _MISSING) is not value:
                d[key] = value
                fixed += 1
    if only is None:
        for key, value in snap["builtins"].items():
            if _builtins_dict.get(key, _MISSING) is not value:
                _builtins_dict[key] = value
                fixed += 1
    for module_name, classes in snap["classes"].items():
        if only is not None and not _any(module_name == n or module_name.startswith(n + ".") for n in names):
            continue
        for cls, saved in classes:
            current = _type_dict(cls)  # not cls.__dict__: a metaclass could fake that
            if _len(current) != _len(saved):
                for key in [k for k in current if k not in saved]:
                    _type_delattr(cls, key)
                    fixed += 1
            for key, value in saved.items():
                if current.get(key, _MISSING) is not value:
                    _type_setattr(cls, key, value)
                    fixed += 1
    return fixed


_IMPORT_SOURCE = '''
def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    """The test's __import__: the modules an import statement binds come back as they were in
    the zygote (sys.modules entry and attributes), and are remembered as reached by the test."""
    if level == 0 and type(name) is str:
        parts = name.split(".")
        wanted = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for item in fromlist or ():
            if type(item) is str:
                wanted.append(name + "." + item)
        wanted = [n for n in wanted if n in modules]
        if wanted:
            restore(snap, wanted)
            for n in wanted:
                if n not in reached:
                    reached.append(n)
    return real_import(name, globals, locals, fromlist, level)
'''


_IMPORT_CODE = compile(_IMPORT_SOURCE, "<test import>", "exec")


def test_namespace(solution_ns: dict, snap: dict, keep: frozenset = frozenset(), reached: list | None = None) -> dict:
    """A fresh namespace for one test: the solution's names, minus its shadowing of builtins and
    standard modules (``keep`` lists names the tests are meant to call, e.g. the entry point), with
    a private copy of the builtins whose ``__import__`` restores what the test imports.

    Every standard module the test can reach by name is restored now and appended to ``reached``
    (the return guard restores those again after each call into the solution).
    """
    reached = [] if reached is None else reached
    ns = _dict(solution_ns)
    module_ids, modules, real_builtins = snap["ids"], snap["modules"], snap["builtins"]
    for name in _list(ns):
        if _type(name) is not _str:  # a str subclass key could run code in any method we call
            del ns[name]
            continue
        if name.startswith("__") or name in keep:
            continue
        value = ns[name]
        if name in real_builtins and value is not real_builtins[name]:
            del ns[name]  # the test sees the real builtin
            continue
        if name in modules and value is not modules[name]:
            ns[name] = value = modules[name]
        if _id(value) in module_ids and modules[module_ids[_id(value)]] is value:
            reached.append(module_ids[_id(value)])
    if reached:
        restore_modules(snap, reached)
    # A private copy: replacing builtins.abs from inside a call cannot reach the test's lookups.
    test_builtins = _dict(real_builtins)
    env = {"__builtins__": _TINY_BUILTINS, "modules": modules, "restore": restore_modules, "snap": snap,
           "reached": reached, "real_import": real_builtins["__import__"]}
    _exec(_IMPORT_CODE, env)
    test_builtins["__import__"] = env["guarded_import"]
    ns["__builtins__"] = test_builtins
    return ns


def install_audit_hook(import_code: types.CodeType | None) -> dict:
    """Add the audit hook; returns the harness's private controls (keep them in locals only).

    ``import_code`` is the code object of importlib's ``_compile_bytecode``, the one caller allowed
    to ``marshal.loads`` (every import of a not-yet-loaded module goes through it).

    The returned dict holds ``set_test_globals(ns)`` (functions whose globals are ``ns`` are test
    code: their ``__code__`` is not readable) and ``frames(enabled)`` (lets the harness itself read
    traceback frames while it formats a failure; nothing of the program runs meanwhile).
    """
    state = {"busy": False, "frames": False, "test_globals": None}
    getframe = sys._getframe
    gc_disable, gc_enable, gc_isenabled = gc.disable, gc.enable, gc.isenabled

    def hook(event: str, args: tuple) -> None:
        if state["busy"]:
            return
        if event == "sys._getframe":
            if not state["frames"]:
                raise _ValueError("call stack is not available in the sandbox")
            return
        if event == "object.__getattr__":
            name = args[1] if _len(args) > 1 else None
            if _type(name) is not _str:
                raise _AttributeError("attribute access refused")
            if name in _FRAME_ATTRS and not state["frames"]:
                raise _AttributeError(f"{name} is not available in the sandbox")
            if name == "__code__" and state["test_globals"] is not None:
                fn = args[0]
                if _type(fn) is _FunctionType and fn.__globals__ is state["test_globals"]:
                    raise _AttributeError("__code__ of test functions is not available in the sandbox")
            return
        if event == "object.__setattr__":
            name = args[1] if _len(args) > 1 else None
            if _type(name) is not _str or name == "__code__":
                raise _PermissionError("rebinding __code__ is not allowed in the sandbox")
            return
        if event in _DENIED_EVENTS or event.startswith("ctypes."):
            raise _PermissionError(f"{event} is not allowed in the sandbox")
        if event == "sys.addaudithook":
            raise _HookRefused("audit hooks are reserved for the sandbox")
        if event == "import":
            name = args[0] if args else ""
            if _type(name) is not _str or name.startswith(_DENIED_IMPORT_PREFIXES):
                raise _ImportError(f"import of {name!r} is not allowed in the sandbox")
            return
        if event == "marshal.loads" or event == "marshal.load":
            # Arbitrary marshal data makes arbitrary bytecode, i.e. arbitrary memory access.
            was_enabled = gc_isenabled()
            gc_disable()  # no finalizer of the program may run while the hook is busy
            state["busy"] = True
            try:
                caller = getframe(1).f_code
            finally:
                state["busy"] = False
                if was_enabled:
                    gc_enable()
            if import_code is None or caller is not import_code:
                raise _PermissionError("marshal.loads is only allowed for imports in the sandbox")

    def set_test_globals(ns: dict | None) -> None:
        state["test_globals"] = ns

    def frames(enabled: bool) -> None:
        state["frames"] = enabled is True

    sys.addaudithook(hook)
    return {"set_test_globals": set_test_globals, "frames": frames}


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

_SAFE_DUNDERS = frozenset({
    "__init__", "__new__", "__repr__", "__str__", "__format__", "__doc__", "__module__", "__qualname__",
    "__dict__", "__weakref__", "__slots__", "__annotations__", "__init_subclass__", "__class_getitem__",
    "__match_args__", "__dataclass_fields__", "__dataclass_params__", "__post_init__", "__getnewargs__",
    "__getnewargs_ex__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__orig_bases__",
    "__parameters__", "__firstlineno__", "__static_attributes__", "__abstractmethods__", "_abc_impl",
    # set on classes by the standard library at run time (copy/pickle, typing), no operator meaning
    "__slotnames__", "__signature__", "__text_signature__", "__type_params__", "__final__", "__total__",
    "__required_keys__", "__optional_keys__", "__protocol_attrs__", "__non_callable_proto_members__",
    "__callable_proto_members_only__", "__dataclass_transform__", "__wrapped__",
})


def _is_operator_name(name) -> bool:
    """A dunder that changes how objects of the class behave under operators (not in _SAFE_DUNDERS)."""
    return type(name) is str and name[:2] == "__" and name[-2:] == "__" and name not in _SAFE_DUNDERS


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
    ``reached``, filled by :func:`test_namespace` and the test's imports) and checks the result
    and the arguments (``check``); ``compare``, ``chain``, ``returned``: what the code of
    :func:`instrument_test` calls (see the comment above _SAFE_DUNDERS).
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
        "HEAPTYPE": _HEAPTYPE,
        "missing": _MISSING,
        "mro_of": type_attr["__mro__"].__get__,
        "dict_of": type_attr["__dict__"].__get__,
        "flags_of": type_attr["__flags__"].__get__,
        "klass_name": type_attr["__name__"].__get__,
        "safe": _SAFE_DUNDERS,
        "object_type": object,
        "oid": _oid,
        "scalar_ids": frozenset(_oid(t) for t in scalars),
        "value_ids": frozenset(_oid(t) for t in values),
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
        "flat_ids": frozenset(_oid(t) for t in (list, tuple, set, frozenset, dict, type({}.keys()))),
        "plain_bases": (int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset, deque),
        "flatten": itertools.chain.from_iterable,
        "dict_items": dict.items, "od_items": collections.OrderedDict.items, "list_copy": list.copy,
        "tuple_iter": tuple.__iter__, "set_iter": set.__iter__, "frozenset_iter": frozenset.__iter__,
        "deque_iter": deque.__iter__, "int_copy": int.__int__, "float_copy": float.__float__,
        "str_copy": str.__str__, "bytes_copy": bytes.__bytes__, "complex_copy": complex.__complex__,
        "bytearray_copy": bytearray.copy,
        "c_callables": frozenset(_oid(type(f)) for f in (len, [].append, list.append, object.__init__, (1).__add__,
                                                         dict.fromkeys)),
        "type_type": type,
        "ops": (operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge),
        "op_contains": operator.contains,
        "Rejected": ReturnRejected,
        "restore": restore_modules,
        "snap": snap,
        "reached": reached,
    }
    exec(_GUARD_CODE, env)
    return {name: env[name] for name in ("wrap", "check", "compare", "chain", "call", "returned")}


def guard_solution_functions(ns: dict, wrap) -> list[str]:
    """Replace, in a test namespace, every function the solution defined by its guarded wrapper."""
    wrapped = []
    for name, value in _list(ns.items()):
        if _type(value) is _FunctionType and value.__code__.co_filename == SOLUTION_FILENAME:
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
    above _SAFE_DUNDERS). Line numbers are kept, so failures still name the test's line. Raises
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
