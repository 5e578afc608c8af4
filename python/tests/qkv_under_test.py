"""The qkv module the tests run against.

By default the source tree's python/qkv (with the library it finds:
$QKV_LIBRARY or the newest build*/libqkv.so). With QKV_TEST_INSTALLED=1 the
installed package instead (pip install . at the repository root): the source
tree stays off sys.path, and the test fails unless the module and the
library it loaded are the package's own, outside the source tree."""
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_PYTHON = os.path.dirname(HERE)

if os.environ.get("QKV_TEST_INSTALLED") == "1":
    sys.path[:] = [p for p in sys.path
                   if os.path.abspath(p or os.curdir) not in (HERE, SOURCE_PYTHON)]
    qkv = importlib.import_module("qkv")
    pkg = os.path.dirname(os.path.abspath(qkv.__file__))
    if pkg.startswith(SOURCE_PYTHON + os.sep) or \
            os.path.dirname(os.path.abspath(qkv.library_path)) != pkg:
        raise SystemExit("QKV_TEST_INSTALLED=1: qkv came from %s with %s, not from an installed "
                         "package holding its libqkv.so (pip install . at the repository root; "
                         "unset QKV_LIBRARY)" % (qkv.__file__, qkv.library_path))
else:
    sys.path.insert(0, SOURCE_PYTHON)
    qkv = importlib.import_module("qkv")
