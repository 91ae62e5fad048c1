"""Small Java classes compiled at run time, for work a py4j call per item would make slow.

Every Spark ships the Janino compiler for its own code generation; a class compiled with it
is loaded in the driver (a class loader over Spark's own) and, when its objects go into
tasks, given to the executors as a jar (``SparkContext.addJar``; the jar lives in a directory
of this process's own, removed at exit). Janino compiles Java without generics: the sources
use raw types and erased signatures.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import zipfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["compiled_class", "new_instance"]

log = logging.getLogger("framework.spark")

_loaded: dict[tuple[int, str], Any] = {}  # (JVM SparkContext's hash, class name) -> class
_lock = threading.Lock()


def compiled_class(spark: SparkSession, name: str, source: str, *, executors: bool) -> Any | None:
    """The class ``name`` (fully qualified) compiled from ``source``, once per SparkContext;
    given to the executors too when ``executors``. ``None`` on Spark Connect (no JVM here) or
    when it cannot be compiled (logged at WARNING): callers then do without it."""
    session: Any = spark
    if not hasattr(session, "_jvm") or session.sparkContext is None:
        return None
    context = session.sparkContext._jsc.sc()
    key = (context.hashCode(), name)
    with _lock:
        if key not in _loaded:
            _loaded[key] = _compile(session, context, name, source, executors)
        return _loaded[key]


def new_instance(spark: SparkSession, cls: Any, *arguments: Any) -> Any:
    """``new cls(arguments...)`` of a class from :func:`compiled_class` (its one constructor).

    Raises:
        py4j.protocol.Py4JJavaError: the constructor threw (its exception is the cause).
    """
    session: Any = spark
    array = session.sparkContext._gateway.new_array(session._jvm.java.lang.Object, len(arguments))
    for i, argument in enumerate(arguments):
        array[i] = argument
    return cls.getConstructors()[0].newInstance(array)


def _compile(session: Any, context: Any, name: str, source: str, executors: bool) -> Any | None:
    jvm = session._jvm
    try:
        compiler = jvm.org.codehaus.janino.SimpleCompiler()
        compiler.cook(source)
        jar = _jar(name, bytes(compiler.getBytecodes().get(name)))
        if executors:
            context.addJar(jar)
        urls = session.sparkContext._gateway.new_array(jvm.java.net.URL, 1)
        urls[0] = jvm.java.io.File(jar).toURI().toURL()
        parent = jvm.Thread.currentThread().getContextClassLoader()
        return jvm.java.net.URLClassLoader(urls, parent).loadClass(name)
    except Exception as err:  # (no Janino, a class loader refusing: callers do without)
        log.warning("cannot compile the Java class %s (%s); doing without it", name, err)
        return None


def _jar(name: str, bytecode: bytes) -> str:
    """A jar holding the class, in a directory of this process's own (no other user can have
    put a jar there first), removed when the process exits."""
    directory = tempfile.mkdtemp(prefix="sparksink-jvm-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = os.path.join(directory, name.rsplit(".", 1)[-1] + ".jar")
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr(name.replace(".", "/") + ".class", bytecode)
    return path
