#!/usr/bin/env bash
# The shared library exports exactly the API: the dynamic symbols libqkv.so
# defines are the functions the public headers mark QKV_API, both ways (no
# internal symbol leaks out, no declared function is missing).
#   exports.sh LIBQKV_SO INCLUDE_DIR HAVE_MPI
# INCLUDE_DIR/qkv/*.h are the headers installed beside qkv.h; qkv/dist.h
# declares its functions only in MPI builds (HAVE_MPI 1).
set -euo pipefail
lib=$1 inc=$2 mpi=$3
headers=()
for h in "$inc"/qkv/*.h; do
  [ "$(basename "$h")" = dist.h ] && [ "$mpi" != 1 ] && continue
  headers+=("$h")
done
declared=$(grep -h '^QKV_API ' "${headers[@]}" | sed -E 's/\(.*//; s/.*[ *]//' | sort -u)
if command -v nm >/dev/null 2>&1; then
  exported=$(nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u)
else
  exported=$(readelf --dyn-syms -W "$lib" | awk '$7 != "UND" && $5 != "LOCAL" && NF >= 8 && $8 != "" {print $8}' |
             sed 's/@.*//' | sort -u)
fi
[ -n "$declared" ] || { echo "no QKV_API declaration found under $inc/qkv" >&2; exit 1; }
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
status=0
if [ -n "$extra" ]; then
  echo "exported by $(basename "$lib") but not declared QKV_API in the headers:" >&2
  echo "$extra" | sed 's/^/  /' >&2
  status=1
fi
if [ -n "$missing" ]; then
  echo "declared QKV_API but not exported by $(basename "$lib"):" >&2
  echo "$missing" | sed 's/^/  /' >&2
  status=1
fi
echo "$(echo "$declared" | wc -l) functions declared, $(echo "$exported" | wc -l) exported"
exit $status
