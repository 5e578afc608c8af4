#!/usr/bin/env bash
# The Python package (pyproject.toml, setup.py): `pip wheel .` builds a
# wheel holding qkv/libqkv.so (built by CMake, needing only libc, libm and
# pthreads), `pip install .` installs it into a fresh virtual environment,
# and python/tests/test_qkv.py (and test_torch.py when PyTorch is there)
# runs against the installed package from outside the source tree, with no
# QKV_LIBRARY (QKV_TEST_INSTALLED=1: the tests fail unless they import the
# installed package and its own library).
#
# Usage: tests/python_package.sh [PYTHON]   (default /usr/bin/python3, else python3)
# Needs: cmake, a C compiler, PYTHON with venv, NumPy, setuptools and wheel
# (Debian: apt-get install python3-venv python3-numpy python3-setuptools
# python3-wheel). No network: the venv sees the system's packages
# (--system-site-packages) and pip builds with --no-build-isolation.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-}
if [ -z "$py" ]; then
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
fail() { echo "python_package: $*" >&2; exit 1; }

for m in venv ensurepip numpy setuptools wheel; do
  "$py" -c "import $m" 2>/dev/null ||
    fail "$py has no module '$m' (Debian: apt-get install python3-venv python3-numpy python3-setuptools python3-wheel)"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/qkv-python-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv --system-site-packages "$tmp/venv"
vpy="$tmp/venv/bin/python"
unset QKV_LIBRARY PYTHONPATH
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

echo "python_package: pip wheel"
"$vpy" -m pip wheel --no-build-isolation --no-deps -w "$tmp/wheels" "$root" >"$tmp/wheel.log" 2>&1 ||
  { tail -n 40 "$tmp/wheel.log" >&2; fail "pip wheel failed"; }
whl=$(ls "$tmp"/wheels/qkv-*.whl)
case "$(basename "$whl")" in
  qkv-*-py3-none-linux_*.whl) ;;
  *) fail "unexpected wheel name $(basename "$whl") (expected qkv-<version>-py3-none-linux_<arch>.whl)" ;;
esac
"$vpy" - "$whl" <<'EOF' || fail "the wheel's contents are wrong"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["qkv/__init__.py", "qkv/torch.py", "qkv/libqkv.so"]
missing = [n for n in need if n not in names]
extra = [n for n in names if n.endswith(".so") and n != "qkv/libqkv.so"]
if missing or extra:
    sys.exit("wheel %s: missing %s, unexpected %s" % (sys.argv[1], missing, extra))
EOF

echo "python_package: pip install (from the source tree)"
"$vpy" -m pip install --no-build-isolation "$root" >"$tmp/install.log" 2>&1 ||
  { tail -n 40 "$tmp/install.log" >&2; fail "pip install failed"; }

cd "$tmp"   # outside the source tree: `import qkv` must find the installed package
lib=$("$vpy" -c 'import qkv; print(qkv.library_path)')
site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ "$lib" = "$site/qkv/libqkv.so" ] || fail "qkv loaded $lib, not the installed $site/qkv/libqkv.so"
needed=$(readelf -d "$lib" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | tr '\n' ' ')
for n in $needed; do
  case "$n" in
    libc.so.*|libm.so.*|libpthread.so.*|ld-linux*) ;;
    *) fail "the installed libqkv.so needs $n (only libc, libm and pthreads are expected)" ;;
  esac
done
echo "python_package: qkv $("$vpy" -c 'import qkv; print(qkv.version())') installed; libqkv.so needs: $needed"

QKV_TEST_INSTALLED=1 "$vpy" "$root/python/tests/test_qkv.py"
if "$vpy" -c "import torch" >/dev/null 2>&1; then
  QKV_TEST_INSTALLED=1 "$vpy" "$root/python/tests/test_torch.py"
else
  echo "python_package: PyTorch not importable: python/tests/test_torch.py not run on the installed package"
fi
echo "python_package: passed"
