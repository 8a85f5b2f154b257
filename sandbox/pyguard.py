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
* with ``guard_solution`` (:mod:`testguard`: ``make_guard``, ``instrument_test``): the test's comparisons
  compare plain data (copies made of builtin types), every value a call in the test returns is
  checked for objects of classes the program made with operator methods or patched (the "always
  equal" object), and the solution's functions the tests call are wrapped: after each call the
  modules the test reached are restored again (patches made *during* a call cannot fake the
  test's next lines).

What remains is documented in docs/sandbox.md: exploiting CPython memory-safety bugs, and
semantic tricks inside the program's own classes that tests call directly.

Rule for every module that runs inside (guard, pyguard, testguard, harness, zygote): define no class with
Python methods, and keep run secrets (nonce, result writer, hook controls) in local variables.
``object.__subclasses__()`` reaches every class, a method's ``__globals__`` reaches its module, and
from there a program could swap the functions the harness calls; with frames refused, locals and
closures are out of reach.
"""

from __future__ import annotations

import builtins
import gc
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


# Dunders with no operator meaning: a class defining only these cannot fake a comparison.
SAFE_DUNDERS = frozenset({
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
    """A dunder that changes how objects of the class behave under operators (not in SAFE_DUNDERS)."""
    return type(name) is str and name[:2] == "__" and name[-2:] == "__" and name not in SAFE_DUNDERS
