"""pyspark's cloudpickle in a training process, without importing the pyspark package.

Why: the function of run() is pickled on the driver with ``pyspark.cloudpickle`` (as stock
does), so its pickle names ``pyspark.cloudpickle.cloudpickle``; importing that the usual
way runs ``pyspark/__init__`` first, which imports most of PySpark (pyspark.sql, the
errors' catalogue, py4j...): 0.2-0.3 s of every run() on a quiet machine, 1.5-1.9 s on a
loaded one (docs/benchmarks.md, "The driver's rendezvous, pyspark's import and Spark's first
failure"), before the user's function even starts. cloudpickle itself
needs only the standard library.

How: :func:`load` puts a *deferred* ``pyspark`` package in sys.modules (the real package's
spec, path and file, its ``__init__`` not run yet) and imports the real
``pyspark.cloudpickle`` submodules under it, with their real names, so pickles made on the
driver load here and results pickled here load on the driver, as with stock. The first
time anything else of pyspark is used, the package completes itself in place, before the
use, by running the real ``pyspark/__init__``: an attribute (``from pyspark import
SparkContext``, ``pyspark.__version__``) or the import of any other submodule (``import
pyspark.sql``, also when a pickle refers to one). The import of that submodule then goes
on as it would have: a module that ``pyspark/__init__`` itself imported (or aliased, as
``pyspark.rdd``) is the same object, never run twice. A function that uses pyspark
therefore sees the same package as under a plain import; one that does not never pays
for it.

Nothing here is used where pyspark is already imported (an executor's Python worker, the
driver): :func:`load` then returns the imported module.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any, List, Optional

_PREFIX = "pyspark.cloudpickle"


def load() -> ModuleType:
    """``pyspark.cloudpickle``, importing as little of pyspark as possible."""
    if "pyspark" in sys.modules:
        return importlib.import_module(_PREFIX)
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return importlib.import_module(_PREFIX)  # an unusual installation: the plain way
    package = importlib.util.module_from_spec(spec)
    deferred = _Deferred(package, spec)
    sys.modules["pyspark"] = package
    try:
        module = importlib.import_module(_PREFIX)
    except BaseException:
        if sys.modules.get("pyspark") is package:
            del sys.modules["pyspark"]
        raise
    deferred.arm()
    return module


class _Deferred:
    """Completes the deferred package in place on its first use (see the module's doc)."""

    def __init__(self, package: ModuleType, spec: Any) -> None:
        self.package, self.spec = package, spec
        self.lock = threading.RLock()
        self.done = False
        self.finder: Optional[_Existing] = None

    def arm(self) -> None:
        # Without __path__ in its namespace, the package is asked for it (module
        # __getattr__, PEP 562) before any other submodule is imported: that completes it.
        ns = self.package.__dict__
        del ns["__path__"]
        ns["__getattr__"] = self.getattr
        ns["__dir__"] = self.dir

    def getattr(self, name: str) -> Any:
        self.complete()
        try:
            return self.package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'pyspark' has no attribute {name!r}") from None

    def dir(self) -> List[str]:
        self.complete()
        return sorted(self.package.__dict__)

    def complete(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
            ns = self.package.__dict__
            ns.pop("__getattr__", None)
            ns.pop("__dir__", None)
            ns["__path__"] = list(self.spec.submodule_search_locations)
            before = set(sys.modules)
            try:
                self.spec.loader.exec_module(self.package)
            except BaseException:
                if sys.modules.get("pyspark") is self.package:
                    del sys.modules["pyspark"]
                raise
            # The import that asked for __path__ goes on to look its submodule up; when
            # pyspark/__init__ already made it (imported or aliased), it must get that
            # module, not a second execution of its file (see _Existing).
            made = {n for n in sys.modules if n.startswith("pyspark.")} - before
            if made:
                self.finder = _Existing(made)
                sys.meta_path.insert(0, self.finder)


class _Existing:
    """Answers, once, the one import that was under way when the package completed: with
    the module already in sys.modules under that name. Then leaves sys.meta_path.
    (A meta path finder and its loader; not derived from importlib.abc, whose import
    costs more than the rest of this module.)"""

    def __init__(self, names: "set[str]") -> None:
        self.names = names
        self.module: Optional[ModuleType] = None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        # The first lookup after the completion is that import's (or, when an attribute
        # completed the package, a later one that needs nothing from here).
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        if fullname not in self.names or fullname not in sys.modules:
            return None
        self.module = sys.modules[fullname]
        self.spec = self.module.__spec__
        return importlib.util.spec_from_loader(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set ours: give it its own back
