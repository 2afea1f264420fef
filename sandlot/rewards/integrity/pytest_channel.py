# mypy: ignore-errors
# (runs on the sandbox's interpreter, Python >= 3.6 and any pytest >= 3.6: untyped on purpose)
"""sandlot's pytest plugin: per-test outcomes on a channel the code under test does not share.

This file is copied into the evaluation sandbox under a random module name and run as its own
bootstrap: the runner's shell function starts ``python -S <this file> NAME RECORDS ROOT
module|script TARGET ARGS`` in place of ``python -m pytest ARGS`` / ``pytest ARGS`` (see
:func:`_boot`). It runs on the sandbox's interpreter: standard library only, Python >= 3.6,
pytest >= 3.6 (old-style ``hookwrapper`` hooks, as every pytest and pluggy release since then
supports).

* fd 3: a pipe holding one line, the per-run key (hex). It is read by :func:`_take_key`, the
  first thing this file does when run, before anything but the standard library is importable,
  and closed; the pipe is then empty, so nothing run later (the tests, a child, a sibling
  reading ``/proc/<ppid>/fd/3``) can read it. The key becomes an HMAC object and the raw bytes
  are zeroed; it is never in the environment, argv or a file.
* the records file, outside the repository, opened on a close-on-exec descriptor >= 200.

pytest, then this file again under NAME (the plugin), are imported with no directory of the
repository on ``sys.path`` but the interpreter's own environment (a virtualenv inside the
repository is one: the evaluator refuses patches that touch it); the repository's paths come
back only once the channel is open, and a ``sys.meta_path`` finder keeps the modules pytest,
the standard library and installed packages import from resolving to files of the repository
for the rest of the run.

Each record is one line, ``<json>\\t<hex HMAC-SHA256(key, json)>``, with a sequence number
``n`` counting from 0: ``start``, ``items`` (the ids pytest collected, right before the run
loop), one ``phase`` record per setup/call/teardown report, ``plugin`` for every plugin
registered after the session started, ``tamper`` when pytest's own machinery was found changed,
and ``end`` from the outermost ``pytest_sessionfinish`` position. A ``phase`` record puts
together what three positions saw: ``raw``, the exception the phase's hook really raised (from
the innermost ``pytest_runtest_<when>`` wrapper); ``inner``, the report outcome pytest built
(innermost ``pytest_runtest_makereport`` wrapper); ``outer``, the outcome of the report as it
reached ``pytest_runtest_logreport`` (outermost wrapper, before any other implementation).

Threat model: nothing of the repository runs before the key is taken; the code under test runs
in this process afterwards and could, knowing this plugin, find its state in memory and sign
with it. What it cannot do without targeting sandlot by name is forge a record:
hook wrappers, rewritten reports, shadowed runners, printed lines, monkeypatched pytest or
pluggy internals, direct hook calls and early exits all leave records that disagree, or no
``end`` record. The runner (``sandlot.rewards.integrity.channel``) decides.
"""

import contextlib
import hashlib
import hmac
import json
import os
import sys

KEY_FD = 3
# The builtin, held from before the repository runs (code under test may replace builtins').
_COMPILE = compile
_BUILTINS = sys.modules["builtins"]
# What the runner's shell function hands the bootstrap besides argv (popped at once).
ENV_PYTHONPATH = "__SANDLOT_PYTHONPATH"
ENV_PYTHONPATH_SET = "__SANDLOT_PYTHONPATH_SET"


def _take_key():
    """Read the key (hex, one line) from fd 3, close it, and return an HMAC object of it, or
    ``None`` (a later pytest session of the same test command gets an empty line).

    The raw key lives only in two bytearrays zeroed before this returns.
    """
    buf = bytearray(160)
    got = 0
    try:
        while got < len(buf) and buf.find(b"\n", 0, got) < 0:
            n = os.readv(KEY_FD, [memoryview(buf)[got:]])
            if not n:
                break
            got += n
        os.close(KEY_FD)
    except OSError:
        return None
    end = buf.find(b"\n", 0, got)
    size = (end if end >= 0 else got) // 2
    key = bytearray(size)
    try:
        for i in range(size):
            key[i] = int(buf[2 * i : 2 * i + 2], 16)
        mac = hmac.new(key, digestmod=hashlib.sha256) if size else None
    except ValueError:
        mac = None
    for i in range(len(buf)):
        buf[i] = 0
    for i in range(size):
        key[i] = 0
    return mac


# -- the bootstrap: ``python -S <this file> NAME RECORDS ROOT module|script TARGET ARGS...``


def _inside(path, root):
    path = os.path.realpath(path or os.curdir)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _runner_in(root):
    """Where the runner's packages (``pytest``, ``_pytest``, ``pluggy``) are about to be
    imported from, for those inside ROOT and outside the interpreter's prefix: the repository
    is then the runner (pytest-dev/pytest installed from its work tree), and these package
    directories (or module files) are code under test. Looked up before any of them is
    imported, so no code of the repository has run yet."""
    import importlib.util

    prefixes = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)]
    found = []
    for name in ("pytest", "_pytest", "pluggy"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        for path in list(spec.submodule_search_locations or []) or [spec.origin or ""]:
            path = os.path.realpath(path) if os.path.isabs(path) else ""
            if path and _inside(path, root) and not any(_inside(path, p) for p in prefixes):
                found.append(path)
    return found


def _in_environment(path, root):
    """``path``, inside ``root``, lies in a Python environment: it has a ``site-packages`` or
    ``dist-packages`` component, or a directory of the repository on the way to it holds
    ``pyvenv.cfg``."""
    parts = os.path.realpath(path)[len(root.rstrip(os.sep)) :].split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    here = root
    for part in filter(None, parts):
        here = os.path.join(here, part)
        if os.path.isfile(os.path.join(here, "pyvenv.cfg")):
            return True
    return False


def _restore(full, held, which):
    """Put the ``sys.path`` entries ``full[i]`` for ``i`` in ``which`` (indices of ``held``,
    those set aside) back where they stood in ``full``; ``held`` keeps the others."""
    for i in sorted(which):
        held.discard(i)
        sys.path.insert(sum(1 for j in range(i) if j not in held), full[i])


class _RunnerImports:
    """A ``sys.meta_path`` finder: a top-level module imported by code that is not the
    repository's (pytest, pluggy, the standard library, installed packages, this bootstrap;
    the interpreter's own environment is not the repository's even inside it, ``own``)
    comes from the start-up path when that path has it, so no file of the repository or of a
    ``PYTHONPATH`` directory inside it can stand in for a module the runner imports, now or
    lazily later (``pdb`` in ``pytest_configure``, ``tomllib`` for ``pyproject.toml``, ...).
    Imports made by the repository's own code resolve as they always do."""

    def __init__(self, safe_path, root, own):
        import importlib.machinery

        self._find = importlib.machinery.PathFinder.find_spec
        self._path = safe_path
        self._root = root.rstrip(os.sep) + os.sep
        # The interpreter's own directories inside the repository (its environment).
        self._own = tuple(d.rstrip(os.sep) + os.sep for d in own)

    def _importer_is_repository(self):
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not (filename.startswith("<frozen") or "importlib" in filename):
                return filename.startswith(self._root) and not filename.startswith(self._own)
            frame = frame.f_back
        return False

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name or self._importer_is_repository():
            return None
        return self._find(name, self._path)


class _Audit:
    """A PEP 578 audit hook, installed by the bootstrap before anything of the repository can
    run (an audit hook cannot be removed from Python). It notes, as tampering, what the code
    under test does to the interpreter that would change what the tests are:

    * ``object.__setattr__`` of ``__code__`` on a function of the repository, pytest, pluggy
      or this plugin (a test's code swapped in place);
    * ``sys.settrace``/``sys.setprofile``/``sys.monitoring.register_callback`` called by code of
      the repository (a tracer sees every frame of the tests: it can swap their functions
      before collection, or jump over an ``assert``);
    * ``compile`` of code attributed to an existing ``.py`` file from a source that is not
      that file, outside the import system and pytest's assertion rewriter;
    * ``code.__new__`` (``CodeType``, ``code.replace``) by code of the repository, attributing
      the new code to another existing file.

    Installed and third-party code (coverage's tracer, pytest's own pdb, a library's ctypes)
    is not held against the run. ``findings`` is drained into ``tamper`` records.
    """

    EVENTS = frozenset(
        (
            "object.__setattr__",
            "sys.settrace",
            "sys.setprofile",
            "sys.monitoring.register_callback",
            "compile",
            "code.__new__",
            "sys.addaudithook",
            "marshal.loads",
        )
    )

    def __init__(self, root, own_file):
        import _thread

        self.root = root.rstrip(os.sep) + os.sep
        self.own = own_file
        self.stdlib = os.path.dirname(os.path.realpath(os.__file__)) + os.sep
        self.environment = ()  # installed code: site directories, prefixes (set by _boot)
        self.runner = ()  # pytest's, pluggy's and this plugin's files (set by _boot)
        self.rewriter = None  # pytest's assertion rewriter module file
        self.tests = frozenset()  # the graded test files (set by _boot)
        self.findings = []
        self._busy = set()
        self._ident = _thread.get_ident

    def __call__(self, event, args):
        if event not in self.EVENTS:
            return
        me = self._ident()
        if me in self._busy:
            return
        self._busy.add(me)
        try:
            self._see(event, args)
        except Exception:  # an audit hook that raises would abort the audited operation
            pass
        finally:
            self._busy.discard(me)

    def kind(self, filename):
        """``"runner"``, ``"environment"``, ``"repository"`` or ``"other"`` for a code file.

        A name is only what a ``compile()`` said: runner and environment need the file to
        exist (code made under the name of an installed file is itself a finding)."""
        if not filename or filename.startswith("<"):
            return "other"
        path = os.path.realpath(filename)
        installed = path == self.own or path.startswith((self.stdlib, *self.environment))
        if installed and not os.path.isfile(path):
            return "other"
        if path == self.own or path.startswith(self.runner):
            return "runner"
        if installed:
            return "environment"
        if path.startswith(self.root):
            return "repository"
        return "other"

    def posing(self, filename):
        """``True`` for a code file name that claims the import system or installed code: a
        ``<frozen ...>`` name, or a path under the runner, the standard library or a site
        directory."""
        if filename.startswith("<frozen"):
            return True
        if filename.startswith("<"):
            return False
        path = os.path.realpath(filename)
        return path.startswith((self.stdlib, *self.environment, *self.runner))

    def is_test(self, filename):
        """``True`` for a file of the repository's tests: a graded test file, a conftest, or
        what the revert rules call test code (a ``test``/``tests``/``testing`` directory,
        ``test_*.py``, ``*_test.py``)."""
        path = os.path.realpath(filename)
        if path in self.tests:
            return True
        if not path.startswith(self.root) or self.kind(path) != "repository":
            return False
        parts = path[len(self.root) :].split(os.sep)
        name = parts[-1]
        return (
            name == "conftest.py"
            or name.startswith("test_")
            or name.endswith("_test.py")
            or bool({"test", "tests", "testing"}.intersection(parts[:-1]))
        )

    def caller(self, depth):
        """The file of the nearest frame outside the standard library, or ``None`` when there
        is none before the import system (standard-library code run by an import, a module's
        code unmarshalled) or the bottom of a thread's stack. (A ``<frozen`` frame of code
        made at run time would be a finding of its own: see :meth:`_compiled`.)"""
        frame = sys._getframe(depth)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith("<frozen"):
                return None
            path = os.path.realpath(filename)
            if not (path.startswith(self.stdlib) and os.path.isfile(path)):
                return filename
            frame = frame.f_back
        return None

    def _see(self, event, args):
        if event == "object.__setattr__":
            obj, name = args[0], args[1]
            code = getattr(obj, "__code__", None) if name == "__code__" else None
            if code is None:
                return
            who = sys._getframe(2).f_code.co_filename
            if (
                code is not None
                and (self.kind(code.co_filename) == "runner" or self.is_test(code.co_filename))
                and not (self.kind(who) == "runner" or self.is_test(who))
            ):
                self.findings.append(
                    "the code of {} ({}) was replaced".format(
                        getattr(obj, "__qualname__", "?"), code.co_filename
                    )
                )
        elif event.startswith(("sys.set", "sys.monitoring")):
            who = self.caller(3)
            if event == "sys.setprofile" and who is not None and self.kind(who) == "repository":
                return  # a profiler of the code under test (cProfile): it cannot jump lines
            if (
                who is not None
                and self.kind(who) in ("repository", "other")
                and not self.is_test(who)
            ):
                self.findings.append(f"{event} was called by {who}")
        elif event == "compile":
            self._compiled(args[0], args[1])
        elif event == "code.__new__":
            filename = args[1]
            who = self.caller(3)
            if (
                who is not None
                and isinstance(filename, str)
                and self.kind(who) in ("repository", "other")
                and not self.is_test(who)
                and (
                    self.posing(filename)
                    or (
                        filename.endswith(".py")
                        and os.path.realpath(filename) != os.path.realpath(who)
                        and os.path.isfile(filename)
                    )
                )
            ):
                self.findings.append(f"{who} made a code object of {filename}")
        elif event in ("sys.addaudithook", "marshal.loads"):
            who = self.caller(3)
            if (
                who is not None
                and self.kind(who) in ("repository", "other")
                and not self.is_test(who)
            ):
                self.findings.append(f"{event} was called by {who}")

    def _compiled(self, source, filename):
        """``compile()`` outside the import system and pytest's rewriter must not give code
        the name of another source: a ``<frozen`` name, a missing file under the runner, the
        standard library or a site directory, or an existing ``.py`` file whose bytes are not
        the source."""
        if not isinstance(filename, str):
            return
        frame = sys._getframe(3)
        first = frame.f_code.co_filename
        if first.startswith("<frozen importlib._bootstrap"):
            return  # the import system compiles the file it has just read
        path = os.path.realpath(first)
        if path == self.own or (
            path == self.rewriter and os.path.isfile(path) and not isinstance(source, (bytes, str))
        ):
            return  # this bootstrap, or pytest's rewriter compiling the tree of a file it read
        posing = self.posing(filename)
        exists = not filename.startswith("<") and os.path.isfile(filename)
        if not filename.endswith(".py") and (exists or not posing):
            return  # a template compiled under its own name (jinja2), or no file's name
        if not exists:
            if posing:
                self.findings.append(f"code named {filename} was compiled by {first}")
            return
        try:
            with open(filename, "rb") as f:
                same = f.read() == (source.encode("utf-8") if isinstance(source, str) else source)
        except OSError:
            same = False
        if not same:
            self.findings.append(f"code attributed to {filename} was compiled by {first}")


class _TrustedCode:
    """The code of the graded tests as compiled from their files' bytes, read by the bootstrap
    before anything of the repository ran: rewritten by pytest's assertion rewriter (at once),
    and plain or rewritten with the assertion pass hook (the first time a test needs them).
    Only the graded ``def`` statements are compiled, with the rest of the module but the other
    ``def``s and classes, so a long test file costs what its graded tests cost. A graded test
    must run one of these code objects (code objects compare by bytecode, constants, names
    and line table)."""

    def __init__(self, root):
        self.root = root.rstrip(os.sep) + os.sep
        self.tests = {}  # (realpath, class name or None, function name) -> [code, ...]
        self.xfail = {}  # the same keys -> the source declares an expected failure
        self.names = {}  # realpath -> names the module binds at its top (None: open set)
        self.imports = {}  # realpath -> [(name, module, attribute or None)] of its imports
        self._pending = []  # (path, source, wanted) still without the other variants

    def add(self, path, source, wanted):
        """Compile the ``def``s of ``wanted`` (``{(class or None, name)}``) in ``source`` as
        pytest's rewriter does by default; the other variants wait for :meth:`more`."""
        self._compile(path, source, wanted, False)
        self._pending.append((path, source, wanted))

    def more(self):
        """Add the plain variants (a file pytest does not rewrite: ``--assert=plain``, not a
        ``python_files`` match) and those rewritten with ``enable_assertion_pass_hook``, the
        first time a test does not match; ``False`` when there were none left to add."""
        pending, self._pending = self._pending, []
        for path, source, wanted in pending:
            self._compile(path, source, wanted, None)
            self._compile(path, source, wanted, True)
        return bool(pending)

    def _compile(self, path, source, wanted, pass_hook):
        import ast

        try:
            tree = _COMPILE(source, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        except Exception:
            return False
        classes = {c for c, _ in wanted if c}
        if pass_hook is False:
            self._facts(path, source, tree, wanted)
        # Every other statement stays: how a name was bound at the top (``import gc``) changes
        # the bytecode of the functions that use it (3.11 calls a module's attributes with
        # LOAD_ATTR, other objects' with LOAD_METHOD).
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        body = []
        for node in tree.body:
            if isinstance(node, defs):
                if (None, node.name) in wanted:
                    body.append(node)
            elif isinstance(node, ast.ClassDef):
                if node.name in classes:
                    node.body = [
                        n
                        for n in node.body
                        if not isinstance(n, (*defs, ast.ClassDef))
                        or (isinstance(n, defs) and (node.name, n.name) in wanted)
                    ] or [ast.Pass(lineno=node.lineno, col_offset=0)]
                    body.append(node)
            else:
                body.append(node)
        tree.body = body
        if pass_hook is not None:
            try:
                from _pytest.assertion import rewrite
            except ImportError:
                return False
            try:
                try:
                    rewrite.rewrite_asserts(tree, source, path, _IniOnly(pass_hook))
                except TypeError:  # pytest < 5.0: no source argument
                    rewrite.rewrite_asserts(tree, path, _IniOnly(pass_hook))
            except Exception:
                return False
        try:
            module = _COMPILE(tree, path, "exec", dont_inherit=True)
        except Exception:
            return False
        real = os.path.realpath(path)
        found = False
        for const in module.co_consts:
            if not isinstance(const, type(module)):
                continue
            if (None, const.co_name) in wanted:
                self.tests.setdefault((real, None, const.co_name), []).append(const)
                found = True
            elif const.co_name in classes:
                for method in const.co_consts:
                    if (
                        isinstance(method, type(module))
                        and (const.co_name, method.co_name) in wanted
                    ):
                        key = (real, const.co_name, method.co_name)
                        self.tests.setdefault(key, []).append(method)
                        found = True
        return found

    def _facts(self, path, source, tree, wanted):
        """What else the file says, before the repository runs: which graded tests declare an
        expected failure (``xfail`` written in the test's ``def``, its class, a module-level
        statement, or a conftest on its path), which names the module binds at its top, and
        what its top-level imports bind."""
        import ast

        real = os.path.realpath(path)
        lines = source.decode("utf-8", "replace").splitlines()

        def text(node):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            return "\n".join(lines[first - 1 : getattr(node, "end_lineno", node.lineno)])

        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        top = [n for n in tree.body if not isinstance(n, (*defs, ast.ClassDef))]
        module_xfail = any("xfail" in text(n).lower() for n in top) or _conftests_say_xfail(
            real, self.root
        )
        for node in tree.body:
            if isinstance(node, defs) and (None, node.name) in wanted:
                self.xfail[(real, None, node.name)] = module_xfail or "xfail" in text(node).lower()
            elif isinstance(node, ast.ClassDef):
                head = "\n".join(
                    [text(n) for n in node.body if not isinstance(n, (*defs, ast.ClassDef))]
                    + [lines[d.lineno - 1] for d in node.decorator_list]
                )
                for n in node.body:
                    if isinstance(n, defs) and (node.name, n.name) in wanted:
                        key = (real, node.name, n.name)
                        self.xfail[key] = (
                            module_xfail or "xfail" in head.lower() or "xfail" in text(n).lower()
                        )
        # Names: dynamic binding (star imports, globals(), setattr, a `global` statement)
        # makes the set open, and it is not checked.
        if any(w in source for w in (b"import *", b"globals()", b"setattr(", b"global ")):
            self.names[real] = None
        else:
            bound = set(_DUNDERS)
            for node in ast.walk(ast.Module(body=top, type_ignores=[])):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    bound.add(node.id)
                elif isinstance(node, (*defs, ast.ClassDef)):  # under an if/try/with
                    bound.add(node.name)
                elif isinstance(node, ast.alias):
                    bound.add((node.asname or node.name).split(".")[0])
            bound.update(n.name for n in tree.body if isinstance(n, (*defs, ast.ClassDef)))
            self.names[real] = bound
        imports = []
        for node in tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    imports.append(
                        (
                            a.asname or a.name.split(".")[0],
                            a.name if a.asname else a.name.split(".")[0],
                            None,
                        )
                    )
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imports.extend((a.asname or a.name, node.module, a.name) for a in node.names)
        rebound = {
            n.id
            for n in ast.walk(ast.Module(body=top, type_ignores=[]))
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        self.imports[real] = [i for i in imports if i[0] not in rebound and i[0] != "*"]

    def expected(self, path, cls, name):
        """The trusted code objects of test ``name`` (of class ``cls``) in ``path``, or
        ``None`` when it is not a graded ``def`` of a graded file."""
        return self.tests.get((os.path.realpath(path), cls, name))


# Names every module has, and those pytest's assertion rewriter adds.
_SHADOWABLE = frozenset(dir(sys.modules["builtins"])) | {"pytestmark", "pytest_plugins"}
_DUNDERS = (
    "__name__",
    "__doc__",
    "__package__",
    "__loader__",
    "__spec__",
    "__file__",
    "__cached__",
    "__builtins__",
    "__annotations__",
    "@py_builtins",
    "@pytest_ar",
)


def _conftests_say_xfail(path, root):
    """``True`` when a ``conftest.py`` between ``root`` and ``path``'s directory mentions
    ``xfail`` (a hook there may mark tests)."""
    here = os.path.dirname(path)
    while here.startswith(root.rstrip(os.sep)) and len(here) >= len(root.rstrip(os.sep)):
        try:
            with open(os.path.join(here, "conftest.py"), "rb") as f:
                if b"xfail" in f.read().lower():
                    return True
        except OSError:
            pass
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return False


class _IniOnly:
    """The one thing pytest's assertion rewriter asks of its config."""

    def __init__(self, pass_hook):
        self._pass_hook = pass_hook

    def getini(self, name):
        return self._pass_hook if name == "enable_assertion_pass_hook" else None


def _environment(site, root):
    """Directories of installed code (the standard library, site directories), as real paths
    ending in a separator; read once ``site`` ran and before the repository can. A directory
    holding the repository (a ``/usr/src/app`` under a prefix) is not one."""
    import sysconfig

    dirs = {os.path.dirname(os.__file__)}
    dirs.update(
        v
        for k, v in sysconfig.get_paths().items()
        if k in ("stdlib", "platstdlib", "purelib", "platlib")
    )
    with contextlib.suppress(AttributeError):  # the virtualenv module's old site.py
        dirs.update(site.getsitepackages())
    dirs.update(p for p in sys.path if p and "-packages" in p)
    found = (os.path.realpath(d).rstrip(os.sep) + os.sep for d in dirs if d)
    return tuple(sorted(d for d in found if not (root.rstrip(os.sep) + os.sep).startswith(d)))


def _package_dir(module):
    filename = getattr(sys.modules[module], "__file__", None) or ""
    return os.path.dirname(os.path.realpath(filename)) + os.sep


def _graded_tests(directory, root):
    """``{path: {(class or None, function)}}`` of the graded test ids the runner wrote beside
    the records (one pytest node id per line: ``tests/test_a.py::TestA::test_b[x]``), for the
    files that exist."""
    try:
        with open(os.path.join(directory, "graded"), encoding="utf-8") as f:
            ids = f.read().splitlines()
    except OSError:
        return {}
    out = {}
    for nodeid in ids:
        parts = nodeid.split("[", 1)[0].split("::")
        if len(parts) < 2 or len(parts) > 3 or not parts[0].endswith(".py"):
            continue
        path = os.path.join(root, parts[0])
        if os.path.isfile(path):
            cls = parts[1] if len(parts) == 3 else None
            out.setdefault(path, set()).add((cls, parts[-1]))
    return out


class _Trust:
    """What the bootstrap established before the repository could run, for the plugin."""

    in_repository = ()  # the runner's packages, when imported from the repository

    def graded(self, item):
        """``True`` for a collected item that is one of the graded tests."""
        cls = getattr(getattr(item, "cls", None), "__name__", None)
        name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
        path = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
        return self.trusted.expected(path, cls, name) is not None

    def xfail_declared(self, item):
        """``True`` unless ``item`` is a graded test whose source (its ``def``, class, module
        or a conftest on its path) never writes ``xfail``."""
        cls = getattr(getattr(item, "cls", None), "__name__", None)
        name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
        path = os.path.realpath(str(getattr(item, "path", None) or getattr(item, "fspath", "")))
        return self.trusted.xfail.get((path, cls, name), True)

    def is_test_file(self, path):
        """``True`` for a file of the tests (graded files, conftests, test code)."""
        if self.audit is not None:
            return self.audit.is_test(path)
        return os.path.basename(path).startswith(("test_", "conftest"))

    def __init__(self, root, here, environment, runner, fence, trusted, audit):
        self.root = root.rstrip(os.sep) + os.sep
        self.here = here + os.sep
        self.stdlib = os.path.dirname(os.path.realpath(os.__file__)) + os.sep
        self.environment = environment
        self.runner = runner
        self.fence = fence
        self.trusted = trusted
        self.audit = audit


def _boot(mac, code):
    """Start pytest as ``python -m pytest ARGS`` (``module``) or the script ``TARGET ARGS``
    (``script``) would, with this file loaded as the plugin ``NAME``, in this order:

    1. (at import, before this runs) the key read from fd 3 and turned into an HMAC object,
       the raw bytes zeroed: the interpreter runs with ``-S``, ``PYTHONPATH`` unset and this
       file's directory as ``sys.path[0]``, so only the standard library is importable yet;
    2. ``site`` without ``sitecustomize``/``usercustomize`` or the user site, then every
       ``sys.path`` entry inside the repository (ROOT) set aside but the interpreter's own
       environment (its standard library and the site directories of its prefix: R2E-Gym's
       ``/testbed/.venv`` is the environment, a patch touching it is refused);
    3. pytest and the plugin imported, the channel opened (``start`` record, snapshot of
       pytest's internals), the records file on a close-on-exec descriptor;
    4. only then the repository's ways in put back where the real command has them:
       ``PYTHONPATH``, the entries set aside, the user site, ``sitecustomize`` and
       ``usercustomize``, ``sys.path[0]`` (the working directory, or the script's directory),
       with :class:`_RunnerImports` first on ``sys.meta_path``;
    5. ``pytest.main(ARGS, plugins=[plugin])``.
    """
    name, records, root, mode, target = sys.argv[1:6]
    args = sys.argv[6:]
    root = os.path.realpath(root)
    pythonpath = os.environ.pop(ENV_PYTHONPATH, "")
    if os.environ.pop(ENV_PYTHONPATH_SET, ""):
        os.environ["PYTHONPATH"] = pythonpath
    here = os.path.dirname(os.path.realpath(__file__))
    fd = fence = audit = None
    if mac is not None:
        import fcntl

        raw = os.open(records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fd = fcntl.fcntl(raw, fcntl.F_DUPFD, 200)
        fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        os.close(raw)
        # A file whose status changed at or after this tick was written during the run.
        fence = os.fstat(fd).st_ctime_ns
        if hasattr(sys, "addaudithook"):  # Python >= 3.8
            audit = _Audit(root, os.path.join(here, name + ".py"))
            sys.addaudithook(audit)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    for hook in ("sitecustomize", "usercustomize"):
        sys.modules[hook] = None
    import site

    site.ENABLE_USER_SITE = False
    stdlib = list(sys.path)  # -S: the interpreter's standard library only
    site.main()
    environment = _environment(site, root)
    # The interpreter's own environment is where pytest comes from, even inside the repository
    # (R2E-Gym's /testbed/.venv): the evaluator refuses patches that touch it.
    own = set(os.path.realpath(p) for p in stdlib + list(getattr(site, "getsitepackages", list)()))
    full = list(sys.path)
    held = set(i for i, p in enumerate(full) if _inside(p, root) and os.path.realpath(p) not in own)
    sys.path[:] = [p for i, p in enumerate(full) if i not in held]
    kept = [p for p in sys.path if _inside(p, root)]
    kept += [os.path.realpath(p) for p in kept]

    in_repository = []
    try:
        import pytest
    except ImportError:
        # pytest itself is the repository (pytest-dev/pytest installed from its work tree):
        # the runner is the code under test, trusted by definition; the key is already taken.
        # Never a pytest of another environment inside the repository (a second virtualenv,
        # a site-packages a .pth line points to): those are not the repository's code.
        _restore(full, held, [i for i in held if not _in_environment(full[i], root)])
        in_repository = _runner_in(root)
        try:
            import pytest
        except ImportError:
            if mode != "module":
                raise
            # What ``python -m pytest`` says without pytest (the runner's missing_runner reads it).
            sys.stderr.write(sys.executable + ": No module named pytest\n")
            raise SystemExit(1) from None
    # The plugin is this file's code run again as the module NAME: the code object compiled
    # for __main__ is reused (compiling this file takes ~12 ms; twice was most of the cost).
    plugin = type(sys)(name)
    plugin.__file__ = os.path.join(here, name + ".py")
    exec(code, plugin.__dict__)
    if mac is not None:
        runner = tuple(_package_dir(m) for m in ("pytest", "_pytest", "pluggy") if m in sys.modules)
        trusted = _TrustedCode(root)
        for path, wanted in _graded_tests(os.path.dirname(records), root).items():
            with open(path, "rb") as f:
                trusted.add(path, f.read(), wanted)
        if audit is not None:
            audit.environment = environment
            audit.runner = runner
            audit.tests = frozenset(path for path, _, _ in trusted.tests)
            audit.rewriter = os.path.realpath(
                getattr(sys.modules.get("_pytest.assertion.rewrite"), "__file__", "") or "-"
            )
        plugin._start(
            mac, fd, _Trust(root, here, environment, runner, fence, trusted, audit), in_repository
        )

    entries = [p for p in pythonpath.split(os.pathsep) if pythonpath]
    safe = [p for p in entries if not _inside(p, root)] + list(sys.path)
    finder = _RunnerImports(safe, root, kept)
    sys.meta_path.insert(0, finder)
    _restore(full, held, list(held))
    sys.path[:0] = entries
    if not os.environ.get("PYTHONNOUSERSITE") and site.check_enableusersite():
        site.ENABLE_USER_SITE = True
        site.addsitedir(site.getusersitepackages())
    for hook in ("sitecustomize", "usercustomize"):
        del sys.modules[hook]  # from the start-up path only, never from the repository
        if (hook == "sitecustomize" or site.ENABLE_USER_SITE) and finder.find_spec(hook):
            with contextlib.suppress(ImportError):
                __import__(hook)
    if mode == "module":
        argv0 = os.path.join(os.path.dirname(pytest.__file__), "__main__.py")
        first = os.getcwd()
    else:
        argv0 = target
        first = os.path.dirname(os.path.realpath(target))
    if not os.environ.get("PYTHONSAFEPATH"):
        sys.path.insert(0, first)
    sys.argv = [argv0, *args]
    raise SystemExit(int(pytest.main(args, plugins=[plugin])))


if __name__ == "__main__":
    # The bootstrap: the key becomes an HMAC object and its descriptor is closed before any
    # import from outside the standard library; the rest of this file runs as the plugin copy.
    _boot(_take_key(), sys._getframe().f_code)

import pytest  # noqa: E402

# pytest and pluggy internals whose replacement would change what a test run reports; checked
# after collection, after every test and at the end of the session.
# Report classes of subtests: pytest >= 9 (_pytest.subtests) and the pytest-subtests plugin.
_SUBTEST_REPORTS = ("SubtestReport", "SubTestReport")

_WATCHED = (
    ("_pytest.runner", "runtestprotocol"),
    ("_pytest.runner", "call_and_report"),
    ("_pytest.runner", "call_runtest_hook"),
    ("_pytest.runner", "pytest_runtest_setup"),
    ("_pytest.runner", "pytest_runtest_call"),
    ("_pytest.runner", "pytest_runtest_teardown"),
    ("_pytest.runner", "pytest_runtest_makereport"),
    ("_pytest.runner", "pytest_runtest_protocol"),
    ("_pytest.runner", "check_interactive_exception"),
    ("_pytest.runner", "CallInfo"),
    ("_pytest.runner", "TestReport"),
    ("_pytest.runner", "SetupState"),
    ("_pytest.reports", "TestReport"),
    ("_pytest.python", "Function"),
    ("_pytest.python", "Module"),
    ("_pytest.python", "Class"),
    ("_pytest.unittest", "TestCaseFunction"),
    ("_pytest.runner.CallInfo", "from_call"),
    ("_pytest.runner.SetupState", "setup"),
    ("_pytest.runner.SetupState", "teardown_exact"),
    ("_pytest.reports.TestReport", "from_item_and_call"),
    ("_pytest.reports.BaseReport", "passed"),
    ("_pytest.reports.BaseReport", "failed"),
    ("_pytest.python.Function", "runtest"),
    ("_pytest.python.Function", "setup"),
    ("_pytest.python", "pytest_pyfunc_call"),
    ("_pytest.python", "async_warn_and_skip"),
    ("_pytest.unittest.TestCaseFunction", "runtest"),
    ("_pytest.skipping", "pytest_runtest_makereport"),
    ("_pytest.skipping", "evaluate_xfail_marks"),
    ("_pytest.main", "pytest_runtestloop"),
    ("_pytest.main.Session", "perform_collect"),
    ("_pytest.outcomes", "fail"),
    ("_pytest.outcomes", "skip"),
    ("_pytest.outcomes", "xfail"),
    ("pluggy._callers", "_multicall"),
    ("pluggy.callers", "_multicall"),
    ("pluggy._hooks._HookCaller", "__call__"),
    ("pluggy._hooks.HookCaller", "__call__"),
    ("pluggy.hooks._HookCaller", "__call__"),
    ("pluggy._manager.PluginManager", "_hookexec"),
    ("pluggy.manager.PluginManager", "_hookexec"),
    ("builtins", "AssertionError"),
    ("builtins", "Exception"),
    ("builtins", "BaseException"),
    ("builtins", "isinstance"),
    ("builtins", "issubclass"),
)
# Hooks whose implementations decide or carry a test's outcome.
_RUN_HOOKS = (
    "pytest_runtestloop",
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_pyfunc_call",
    "pytest_report_teststatus",
    "pytest_sessionfinish",
    "pytest_collection_modifyitems",
    "pytest_collect_file",
    "pytest_pycollect_makemodule",
    "pytest_pycollect_makeitem",
    "pytest_generate_tests",
    "pytest_make_collect_report",
    "pytest_itemcollected",
)
# Runner attributes pytest itself sets while a test runs (the assertion plugin's hooks into
# rewritten asserts), by "module.attribute".
_MUTABLE = frozenset(
    (
        "_pytest.assertion.util._reprcompare",
        "_pytest.assertion.util._assertion_pass",
        "_pytest.assertion.util._config",
    )
)
_MISSING = object()


def _owner(dotted):
    """The module or class named ``dotted`` (imported if need be), or ``None``."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = __import__(".".join(parts[:cut]), fromlist=["_"])
        except Exception:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def _static(owner, attr):
    """``owner.attr`` as stored (no descriptor binding: a classmethod stays one object)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
        return _MISSING
    return getattr(owner, attr, _MISSING)


class _Channel:
    """Signed, numbered records written to a private descriptor."""

    def __init__(self, mac, fd):
        self._mac = mac
        self._fd = fd
        self._seq = 0

    def send(self, kind, **fields):
        fields["k"] = kind
        fields["n"] = self._seq
        self._seq += 1
        body = json.dumps(fields, sort_keys=True, default=repr)
        mac = self._mac.copy()
        mac.update(body.encode("utf-8"))
        data = (body + "\t" + mac.hexdigest() + "\n").encode("utf-8")
        while data:
            data = data[os.write(self._fd, data) :]


def _impls(caller):
    """A hook caller's implementations (pluggy < 0.7 has no ``get_hookimpls``)."""
    get = getattr(caller, "get_hookimpls", None)
    if get is not None:
        return get()
    return list(getattr(caller, "_nonwrappers", [])) + list(getattr(caller, "_wrappers", []))


def _snapshot():
    """``{label: (owner, attr, value)}`` of the watched internals this pytest has; the owners
    are looked up once, at import, so a check costs only attribute reads."""
    out = {}
    for dotted, attr in _WATCHED:
        owner = _owner(dotted)
        if owner is not None:
            out[dotted + "." + attr] = (owner, attr, _static(owner, attr))
    return out


class _State:
    def __init__(self, channel, trust):
        self.channel = channel
        self.trust = trust
        self.verified = {}  # node id -> the test code found identical to its file's
        self.watched = _snapshot()
        self.internals = {}  # (module or class, attribute) -> callable, every runner module
        self.flat = []  # (namespace, owner, attribute, first value) of the same, to compare
        self.sizes = {}  # id(namespace) -> its size when last enumerated
        self.classes = {}  # module name -> [(owner, namespace)] of its own classes
        self.sweep_internals(None)
        self.pyfunc = set()  # node ids whose test function pytest's pytest_pyfunc_call reached
        self.rewrite_module = sys.modules.get("_pytest.assertion.rewrite")
        self.config = None
        self.baseline = None  # plugins registered when the session started
        self.plugin_files = set()  # files of the plugins registered so far
        self.allowed = {}  # id(hookimpl function) -> True for late module plugins
        self.replacers = set()  # files of plugins that swap pytest internals (flaky)
        self.raw = {}
        self.inner = {}
        self.items = None

    # -- checks of pytest's own machinery

    def sweep_internals(self, pm, fast=False):
        """Every callable of every ``pytest``/``_pytest``/``pluggy`` module and of their own
        classes, against the first value seen; the changed ones are returned as tampering
        unless pytest itself sets them per test (:data:`_MUTABLE`) or a registered plugin's
        file defines the new value (``flaky``). About 6,000 attributes, enumerated at start,
        collection and the end; after each graded test (``fast``) only the ones already seen
        are compared, from a flat list (~1 ms; the watched list covers every test)."""
        changed = []
        for namespace, owner, attr, first in self.flat:
            if namespace.get(attr, _MISSING) is not first:
                changed += self._changed(pm, owner, attr, namespace.get(attr))
        if not fast:
            # What appeared since: modules imported later, and namespaces that grew (a new
            # attribute of a class of pytest's shadows an inherited method as well).
            for modname, module in list(sys.modules.items()):
                if module is None or modname.split(".")[0] not in ("pytest", "_pytest", "pluggy"):
                    continue
                namespace = vars(module)
                if self.sizes.get(id(namespace)) == len(namespace):
                    owners = [
                        (name, ns)
                        for name, ns in self.classes.get(modname, ())
                        if self.sizes.get(id(ns)) != len(ns)
                    ]
                else:
                    owners = [(modname, namespace)]
                    classes = [
                        (modname + "." + value.__qualname__, vars(value))
                        for value in list(namespace.values())
                        if isinstance(value, type) and getattr(value, "__module__", None) == modname
                    ]
                    self.classes[modname] = classes
                    owners += [(n, ns) for n, ns in classes if self.sizes.get(id(ns)) != len(ns)]
                for owner, ns in owners:
                    known = id(ns) in self.sizes
                    self.sizes[id(ns)] = len(ns)
                    for attr, value in list(ns.items()):
                        if not callable(value) and not hasattr(type(value), "__get__"):
                            continue  # data; functions, classes and descriptors (property)
                        if (owner, attr) in self.internals:
                            continue  # compared above
                        self.internals[(owner, attr)] = value
                        self.flat.append((ns, owner, attr, value))
                        if known and owner != modname:
                            # A class of pytest's that gained an attribute: from a registered
                            # plugin (pytest's legacypath adds Node.fspath) or tampering.
                            changed += self._changed(pm, owner, attr, value)
        if pm is not None:
            for obj in (getattr(self, "session", None), self.config, pm):
                changed += _shadowed_methods(obj)
            for plugin in list(getattr(pm, "_conftest_plugins", ())):
                if os.path.basename(getattr(plugin, "__file__", None) or "") != "conftest.py":
                    changed.append(f"{plugin!r} counted as a conftest")
        return changed

    def _changed(self, pm, owner, attr, value):
        if pm is None or owner + "." + attr in _MUTABLE:
            return []
        source = _plugin_replacement(getattr(value, "fget", None) or value, pm)
        if source is None:
            return [f"{owner}.{attr}"]
        if source not in self.replacers:
            self.replacers.add(source)
            self.channel.send("plugin", file=source)
        return []

    def changed_internals(self):
        pm = self.config.pluginmanager
        changed = []
        for label, (owner, attr, value) in self.watched.items():
            now = _static(owner, attr)
            if now is value:
                continue
            source = _plugin_replacement(now, pm)
            if source is None:
                changed.append(label)
            elif source not in self.replacers:
                self.replacers.add(source)
                self.channel.send("plugin", file=source)
        if getattr(pm, "_inner_hookexec", None) is not self.inner_hookexec:
            changed.append("PluginManager._inner_hookexec")
        for name in _RUN_HOOKS:
            caller = getattr(pm.hook, name, None)
            if caller is None:
                continue
            if caller is not self.callers.get(name):
                changed.append(f"hook caller {name}")
                continue
            impls = _impls(caller)
            signature = tuple((id(i), id(i.plugin), id(i.function)) for i in impls)
            if signature == self.approved.get(name):
                continue
            before = len(changed)
            for impl in impls:
                if id(impl.plugin) in self.baseline_plugin_ids:
                    if (name, id(getattr(impl.function, "__func__", impl.function))) not in (
                        self.baseline
                    ):
                        changed.append(f"{name} implementation added to a plugin")
                elif id(impl.function) not in self.allowed:
                    changed.append(f"{name} implemented outside plugin registration")
            if len(changed) == before:
                self.approved[name] = signature
        return changed

    def take_baseline(self, config):
        pm = config.pluginmanager
        self.inner_hookexec = getattr(pm, "_inner_hookexec", None)
        self.callers = {}
        self.approved = {}  # hook name -> implementations already found clean
        self.baseline = set()
        self._baseline_plugins = []
        for name in _RUN_HOOKS:
            caller = getattr(pm.hook, name, None)
            if caller is None:
                continue
            self.callers[name] = caller
            for impl in _impls(caller):
                self.baseline.add((name, id(getattr(impl.function, "__func__", impl.function))))
                if impl.plugin not in self._baseline_plugins:
                    self._baseline_plugins.append(impl.plugin)
        for plugin in pm.get_plugins():
            if plugin not in self._baseline_plugins:
                self._baseline_plugins.append(plugin)
        self.baseline_plugin_ids = set(id(p) for p in self._baseline_plugins)
        files = set(filter(None, (_file_of(p) for p in self._baseline_plugins)))
        for plugin in self._baseline_plugins:
            files.update(_hook_files(plugin))
        for filename in sorted(files):
            self.channel.send("plugin", file=filename)
        self.plugin_files = files
        untrusted = [u for u in map(self.untrusted_file, sorted(files)) if u]
        for plugin in self._baseline_plugins:
            untrusted += _codeless_hooks(plugin)
        if untrusted:
            self.channel.send("tamper", where="plugin", what=untrusted)

    def untrusted_file(self, path):
        """Why the plugin file ``path`` is not the repository's or the environment's as it was
        when the run started, or ``None``."""
        trust = self.trust
        if path.startswith(trust.here):
            return None  # this plugin
        if not path.startswith((trust.root, *trust.environment, *trust.runner)):
            return f"plugin file {path} is outside the repository and the environment"
        try:
            changed = os.stat(path).st_ctime_ns >= trust.fence
        except OSError:
            return f"plugin file {path} is gone"
        if changed:
            return f"plugin file {path} was written during the run"
        return None

    def registrar(self):
        """The file of the code that registered the plugin being registered now, or ``None``
        when pytest itself did (nothing but pytest, pluggy and the standard library between
        here and the bootstrap's ``pytest.main`` call)."""
        trust = self.trust
        skip = (*trust.runner, trust.here, trust.stdlib)
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith("<frozen"):
                path = os.path.realpath(filename)
                if not path.startswith(skip) or not os.path.isfile(path):
                    return path
                if path.startswith(trust.here) and frame.f_code.co_name == "_boot":
                    return None
            frame = frame.f_back
        return "<no caller: a thread or a finaliser>"

    def check(self, where, full=False, graded=False):
        changed = self.changed_internals()
        if (full or graded) and not self.trust.in_repository:
            changed += self.sweep_internals(self.config.pluginmanager, fast=not full)
        audit = self.trust.audit
        if audit is not None and audit.findings:
            changed += audit.findings
            del audit.findings[:]
        if changed:
            self.channel.send("tamper", where=where, what=sorted(set(changed)))

    def late_plugin(self, plugin):
        """Record a plugin registered after the session started (conftests, ``pytest_plugins``).

        Only real modules loaded from a file can be plugins then; their hook functions must
        come from a file too: that module's, or one it imports them from (matplotlib's
        conftest re-exports ``pytest_configure`` from ``matplotlib/testing/conftest.py``).
        Every such file is reported, and the grader rejects the run if the model changed one.
        """
        if any(p is plugin for p in self._baseline_plugins):
            return  # a plugin of the session's start registered again (flask's logging tests)
        module_type = type(sys)
        filename = getattr(plugin, "__file__", None)
        if (
            not isinstance(plugin, module_type)
            or not filename
            or not filename.endswith((".py", ".pyc"))
            or not os.path.isfile(filename)
        ):
            self.channel.send("tamper", where="plugin", what=[f"plugin object {plugin!r}"])
            return
        who = self.registrar()
        if who is not None and who not in self.plugin_files:
            self.channel.send(
                "tamper", where="plugin", what=[f"plugin {filename} registered by {who}"]
            )
        source = filename[:-1] if filename.endswith(".pyc") else filename
        files = {os.path.realpath(source)}
        for value in vars(plugin).values():
            code = getattr(value, "__code__", None)
            if code is None or not getattr(value, "__name__", "").startswith("pytest_"):
                continue
            if not code.co_filename.endswith(".py") or not os.path.isfile(code.co_filename):
                self.channel.send(
                    "tamper", where="plugin", what=[f"hook {value.__name__} of {source}"]
                )
                continue
            files.add(os.path.realpath(code.co_filename))
            self.allowed[id(value)] = True
        untrusted = [u for u in map(self.untrusted_file, sorted(files)) if u]
        untrusted += _codeless_hooks(plugin)
        if untrusted:
            self.channel.send("tamper", where="plugin", what=untrusted)
        self.plugin_files.update(files)
        for path in sorted(files):
            self.channel.send("plugin", file=path)


def _file_of(obj):
    """The source file that defines ``obj`` (a module, or an object of a class), or ``None``."""
    filename = getattr(obj, "__file__", None)
    if filename is None:
        module = sys.modules.get(getattr(type(obj), "__module__", ""), None)
        filename = getattr(module, "__file__", None)
    if not isinstance(filename, str):
        return None
    return os.path.realpath(filename[:-1] if filename.endswith(".pyc") else filename)


def _plugin_replacement(obj, pm):
    """The file of the registered plugin that defines ``obj``, a replacement of a watched
    internal, or ``None`` when ``obj`` comes from anywhere else.

    ``flaky`` swaps ``_pytest.runner.call_and_report`` for its plugin's method while a test
    runs: a plugin the image installed, whose file the grader checks against the model's
    changes. A replacement must be a function (or method, or class) of a module that is, or
    defines the class of, a registered plugin, must be reachable from that module's namespace
    (one class deep) and its code must come from that module's file.
    """
    func = getattr(obj, "__func__", obj)
    code = getattr(func, "__code__", None)
    name = getattr(func, "__module__", None)
    if code is None and not isinstance(obj, type):
        return None
    plugin_modules = set()
    for plugin in pm.get_plugins():
        plugin_modules.add(
            plugin.__name__ if isinstance(plugin, type(sys)) else type(plugin).__module__
        )
    module = sys.modules.get(name or "")
    if name not in plugin_modules or module is None:
        return None
    filename = getattr(module, "__file__", None)
    if not isinstance(filename, str):
        return None
    source = os.path.realpath(filename[:-1] if filename.endswith(".pyc") else filename)
    if not os.path.isfile(source):
        return None
    if code is not None and os.path.realpath(code.co_filename) != source:
        return None
    namespace = list(vars(module).values())
    for value in list(namespace):
        if isinstance(value, type):
            namespace.extend(vars(value).values())
    if not any(value is func or value is obj for value in namespace):
        return None
    return source


def _hook_files(plugin):
    """The files defining the ``pytest_*`` functions of ``plugin`` (a conftest may import its
    hooks from another module of the repository)."""
    found = set()
    for name in dir(plugin):
        if not name.startswith("pytest_"):
            continue
        try:
            code = getattr(getattr(plugin, name), "__code__", None)
        except Exception:
            continue
        if code is not None and os.path.isfile(code.co_filename):
            found.add(os.path.realpath(code.co_filename))
    return found


def _codeless_hooks(plugin):
    """The ``pytest_*`` hooks of ``plugin`` that are not Python functions (a ``partial`` or a
    builtin has no file to judge)."""
    out = []
    for name in dir(plugin):
        if not name.startswith("pytest_"):
            continue
        try:
            value = getattr(plugin, name)
        except Exception:
            continue
        if callable(value) and getattr(getattr(value, "__func__", value), "__code__", None) is None:
            out.append(f"hook {name} of plugin {plugin!r} is not a Python function")
    return out


def _test_callables(item):
    """The callables ``item`` may run as its test, outermost first: its function and that
    function's ``__wrapped__`` chain (``functools.wraps``: ``mock.patch``), and hypothesis'
    inner test."""
    try:
        if type(item).__name__ == "TestCaseFunction":
            obj = getattr(getattr(item.parent, "obj", None), item.name, None)
        else:
            obj = item.__dict__.get("_obj") or getattr(item, "obj", None)
    except Exception:
        obj = None
    out = []
    while obj is not None and len(out) < 20:
        func = getattr(obj, "__func__", obj)
        out.append(func)
        inner = getattr(getattr(func, "hypothesis", None), "inner_test", None)
        obj = getattr(func, "__wrapped__", None) or inner
    return out


def _fingerprint(item):
    """What decides what running ``item`` runs: its class, own ``runtest`` and test code.

    A unittest item's ``obj`` is bound in setup and dropped in teardown, so its code is read
    from the ``TestCase`` class.
    """
    try:
        if type(item).__name__ == "TestCaseFunction":
            obj = getattr(getattr(item.parent, "obj", None), item.name, None)
        else:
            obj = getattr(item, "obj", None)
    except Exception:
        obj = None
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    return (type(item), item.__dict__.get("runtest"), code)


_state = None


def _start(mac, fd, trust, in_repository=()):
    """Open this run's channel (called by the bootstrap on the copy it loaded as a plugin);
    ``in_repository``: the runner's package paths imported from the repository (see
    :func:`_runner_in`), if the repository is the runner."""
    global _state
    trust.in_repository = tuple(in_repository)
    _state = _State(_Channel(mac, fd), trust)
    _state.channel.send(
        "start",
        pid=os.getpid(),
        pytest=getattr(pytest, "__version__", "?"),
        runner=list(in_repository),
    )


def _mine(config):
    return _state is not None and _state.config is config


def pytest_configure(config):
    if _state is not None and _state.config is None:
        _state.config = config


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionstart(session):
    yield
    if _mine(session.config):
        _state.session = session
        _state.take_baseline(session.config)


def pytest_plugin_registered(plugin, manager):
    if (
        _state is not None
        and _state.baseline is not None
        and manager is _state.config.pluginmanager
    ):
        _state.late_plugin(plugin)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtestloop(session):
    if _mine(session.config) and _state.baseline is not None:
        items = list(session.items)
        _state.items = {item.nodeid: (item, _fingerprint(item)) for item in items}
        code_files = {}
        for item in items:
            code = _fingerprint(item)[2]
            if code is not None:
                code_files[item.nodeid] = os.path.realpath(code.co_filename)
            if "runtest" in item.__dict__:
                _state.channel.send(
                    "tamper", where="collection", what=["runtest of " + item.nodeid]
                )
        for item in items:
            _verify_test_code(item, collection=True)
        _verify_collected(items)
        _state.channel.send(
            "items",
            ids=[item.nodeid for item in items],
            xfail=[item.nodeid for item in items if _xfail_expected(item)],
            code_files=code_files,
        )
        _state.check("collection", full=True)
    yield


def _xfail_expected(item):
    if type(item).__name__ == "TestCaseFunction":  # unittest's expectedFailure
        return True
    get = getattr(item, "get_closest_marker", None) or getattr(item, "get_marker", None)
    return bool(get and get("xfail"))


def _record_raw(item, when, outcome):
    """Keep what the innermost wrapper of ``pytest_runtest_<when>`` saw the phase raise."""
    if _mine(item.config):
        exc = outcome.excinfo
        kind = None
        if exc is not None:
            skip = getattr(pytest.skip, "Exception", ())
            xfail = getattr(pytest.xfail, "Exception", ())
            kind = "raised"
            if isinstance(exc[1], skip):
                kind = "skip"
            elif isinstance(exc[1], xfail):
                kind = "xfail"
                caller = _raiser(exc[2])
                if caller is not None and not _state.trust.is_test_file(caller):
                    # pytest.xfail() called by the code under test, not by the test: an
                    # expected failure the model declared for itself (XFAIL grades as passed).
                    _state.channel.send(
                        "tamper",
                        where="test " + item.nodeid,
                        what=[f"pytest.xfail() called by {caller}, not by the tests"],
                    )
        collected, fingerprint = _state.items.get(item.nodeid, (None, None))
        if (
            when == "call"
            and exc is None
            and item.nodeid not in _state.pyfunc
            and collected is not None
            and fingerprint[0].__name__ == "Function"
            and _state.trust.graded(collected)
        ):
            _state.channel.send(
                "tamper",
                where="test " + item.nodeid,
                what=["the call phase passed without pytest calling the test function"],
            )
        _state.raw[(item.nodeid, when)] = kind


def _raiser(tb):
    """The file of the code that called the pytest function raising at the end of ``tb``."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames[:-1]):
        path = os.path.realpath(frame.f_code.co_filename)
        if not path.startswith(_state.trust.runner):
            return path
    return None


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pyfunc_call(pyfuncitem):
    # The innermost wrapper: what pytest's own implementation is about to call. The item
    # must be the collected one (not a proxy handed over by a hook relay), and a graded
    # test's function is checked once more here, after everything that ran since the call
    # phase began.
    if _mine(pyfuncitem.config) and _state.items is not None:
        collected = _state.items.get(pyfuncitem.nodeid, (None, None))[0]
        if collected is not pyfuncitem:
            _state.channel.send(
                "tamper",
                where="test " + str(pyfuncitem.nodeid),
                what=["pytest_pyfunc_call was handed an item pytest did not collect"],
            )
        else:
            _state.pyfunc.add(pyfuncitem.nodeid)
            _verify_test_code(pyfuncitem, fresh=True)
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_setup(item):
    _verify_item(item, "setup")
    outcome = yield
    _record_raw(item, "setup", outcome)


def _verify_item(item, when):
    """The item pytest runs is the one it collected, unchanged (its class, own ``runtest``
    and test code), at the start of each phase: an item put in the list or given another
    class after collection would run what it likes under a graded node id."""
    if not (_mine(item.config) and _state.items is not None):
        return
    collected, fingerprint = _state.items.get(item.nodeid, (None, None))
    if collected is not item:
        what = "an item pytest did not collect runs as " + item.nodeid
    elif _fingerprint(item) != fingerprint:
        what = f"{item.nodeid} changed since collection (class, runtest or test code)"
    else:
        return
    _state.channel.send("tamper", where=f"test {item.nodeid} ({when})", what=[what])


def _matching(codes, expected):
    """The index of the first of ``codes`` equal to one of ``expected``, or ``None``."""
    for i, code in enumerate(codes):
        if code is not None and any(code == c for c in expected):
            return i
    return None


def _shadowed_methods(obj):
    """``obj``'s instance attributes that hide a method of its class (``session.gethookproxy
    = ...``): pytest sets none."""
    if obj is None:
        return []
    out = []
    for name in list(getattr(obj, "__dict__", ())):
        for klass in type(obj).__mro__:
            if name in vars(klass):
                if isinstance(vars(klass)[name], type(_shadowed_methods)):
                    out.append(f"{type(obj).__name__}.{name} hidden by an instance attribute")
                break
    return out


def _verify_collected(items):
    """Every collected test is named as Python names it (a node id whose name is no
    identifier, or holds a line break, would be read by the log parser as another test's),
    and every graded ``def`` of a graded file was collected."""
    wrong = []
    found = set()
    for item in items:
        nodeid = str(item.nodeid)
        if "\n" in nodeid or "\r" in nodeid:
            wrong.append(f"the node id {nodeid!r} holds a line break")
        if type(item).__name__ in ("Function", "TestCaseFunction"):
            name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
            if not (item.name.split("[", 1)[0] == name and name.isidentifier()):
                wrong.append(f"the test {nodeid!r} is not named as its function")
            cls = getattr(getattr(item, "cls", None), "__name__", None)
            path = os.path.realpath(str(getattr(item, "path", None) or getattr(item, "fspath", "")))
            found.add((path, cls, name))
    missing = sorted(set(_state.trust.trusted.tests) - found, key=repr)
    wrong += [f"the graded test {name} of {path} was not collected" for path, _, name in missing]
    if wrong:
        _state.channel.send("tamper", where="collection", what=wrong)


def _verify_namespace(item, path, collection):
    """The graded test module's namespace is what its file makes: pytest's assertion
    helpers (``@pytest_ar``, ``@py_builtins``) are the real modules, no name its top level
    does not bind was added (``pytestmark``, a builtin shadowed), and, when collected, every
    name its top-level imports bind is what the import gives."""
    module = getattr(item.getparent(pytest.Module), "obj", None)
    namespace = getattr(module, "__dict__", None)
    if namespace is None:
        return
    real = os.path.realpath(path)
    trusted = _state.trust.trusted
    wrong = [] if type(module) is type(sys) else ["the module's class"]
    for name, real_module in (("@pytest_ar", _state.rewrite_module), ("@py_builtins", _BUILTINS)):
        if name in namespace and namespace[name] is not real_module:
            wrong.append(name)
    bound = trusted.names.get(real)
    if bound is not None:
        # Only names that change what a test means: a builtin shadowed (isinstance, len,
        # AssertionError) or module-level marks. Python and pytest add others of their own
        # (__warningregistry__, the rewriter's @py_assert temporaries of a top-level assert).
        wrong += sorted(n for n in set(namespace) - bound if n in _SHADOWABLE)
    if collection:
        for name, modname, attr in trusted.imports.get(real, ()):
            if name not in namespace or modname not in sys.modules:
                continue
            value = sys.modules[modname]
            if attr is not None:
                value = getattr(value, attr, sys.modules.get(modname + "." + attr, _MISSING))
            if namespace[name] is not value:
                wrong.append(name)
    if wrong:
        _state.channel.send(
            "tamper",
            where="test",
            what=[f"the namespace of {path} was changed: " + ", ".join(wrong)],
        )


def _verify_test_code(item, fresh=False, collection=False):
    """Send ``tamper`` when a graded test would not run the code compiled from its file, in
    the namespace its file makes (checked when collected, right before each call and in
    ``pytest_pyfunc_call``; the last verified function and code as a fast path unless
    ``fresh``), or when a tracer or profiler of the repository is active."""
    audit = _state.trust.audit
    if audit is not None:
        for kind, hook in (("tracer", sys.gettrace()), ("profiler", sys.getprofile())):
            func = getattr(hook, "__func__", hook)
            where = getattr(getattr(func, "__code__", None), "co_filename", None)
            if where is not None and audit.kind(where) in ("repository", "other"):
                audit.findings.append(f"a {kind} from {where} was active")
    cls = getattr(item, "cls", None)
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    path = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
    expected = _state.trust.trusted.expected(path, getattr(cls, "__name__", None), name)
    if expected is None:
        return
    callables = _test_callables(item)
    codes = [getattr(f, "__code__", None) for f in callables]
    seen = _state.verified.get(item.nodeid)
    _verify_namespace(item, path, collection)
    shadowed = _shadowed_methods(item)
    if shadowed:
        _state.channel.send("tamper", where="test " + item.nodeid, what=shadowed)
    if not fresh and seen is not None and seen[0] is callables[0] and seen[1] is codes[0]:
        return
    matched = _matching(codes, expected)
    if matched is not None:
        module = getattr(item.getparent(pytest.Module), "obj", None)
        if getattr(callables[matched], "__globals__", None) is not getattr(module, "__dict__", 0):
            _state.channel.send(
                "tamper",
                where="test",
                what=[f"test {item.nodeid} runs with globals that are not its module's"],
            )
    if matched is None and _state.trust.trusted.more():
        expected = _state.trust.trusted.expected(path, getattr(cls, "__name__", None), name)
        matched = _matching(codes, expected)
    if matched is None:
        _state.channel.send(
            "tamper",
            where="test",
            what=[f"test code of {item.nodeid} differs from its file {path}"],
        )
    elif audit is not None:
        # What runs first are the wrappers (functools.wraps decorators: mock.patch, a
        # repository's test helpers), from files that existed before the run; those of the
        # repository are reported, and the grader rejects one the model changed.
        for code in codes[:matched]:
            where = getattr(code, "co_filename", "<builtin>")
            kind = audit.kind(where)
            if kind == "repository" and _state.untrusted_file(os.path.realpath(where)) is None:
                _state.channel.send("wrapper", id=item.nodeid, file=os.path.realpath(where))
            elif kind not in ("environment", "runner"):
                _state.channel.send(
                    "tamper",
                    where="test",
                    what=[f"test {item.nodeid} is wrapped by code of {where}"],
                )
    if callables:
        _state.verified[item.nodeid] = (callables[0], codes[0])


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_call(item):
    _verify_item(item, "call")
    if _mine(item.config) and _state.items is not None:
        _verify_test_code(item)
    outcome = yield
    _record_raw(item, "call", outcome)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    _verify_item(item, "teardown")
    outcome = yield
    _record_raw(item, "teardown", outcome)


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _mine(item.config) and outcome.excinfo is None:
        report = outcome.get_result()
        _state.inner[(item.nodeid, call.when)] = getattr(report, "outcome", None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_logreport(report):
    if type(report).__name__ in _SUBTEST_REPORTS:
        # A subtest's extra "call" report (pytest >= 9, pytest-subtests). Graded, like the
        # log, by the test's own reports: a unittest test passes with a failed subTest.
        pass
    elif _state is not None and _state.items is None and _state.baseline is not None:
        _state.channel.send("tamper", where="collection", what=["report of " + report.nodeid])
    elif _state is not None and _state.items is not None:
        key = (report.nodeid, report.when)
        item = _state.items.get(report.nodeid, (None, None))[0]
        if (
            hasattr(report, "wasxfail")
            and item is not None
            and not _state.trust.xfail_declared(item)
        ):
            _state.channel.send(
                "tamper",
                where="test " + report.nodeid,
                what=[f"{report.nodeid}: an expected failure its source does not declare (xfail)"],
            )
        _state.channel.send(
            "phase",
            id=report.nodeid,
            when=report.when,
            outer=report.outcome,
            wasxfail=hasattr(report, "wasxfail"),
            raw=_state.raw.pop(key, "missing"),
            inner=_state.inner.pop(key, "missing"),
        )
        if report.when == "teardown":
            item, fingerprint = _state.items.get(report.nodeid, (None, None))
            graded = item is not None and _state.trust.graded(item)
            _state.check("test " + report.nodeid, graded=graded)
            if item is not None and _fingerprint(item) != fingerprint:
                _state.channel.send("tamper", where="test", what=["test code of " + report.nodeid])
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    if _mine(session.config):
        if _state.baseline is not None:
            _state.check("session end", full=True)
        _state.channel.send("end", exitstatus=int(exitstatus))
