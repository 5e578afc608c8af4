#!/usr/bin/env bash
# Every subcommand that `qkv --help` lists answers `qkv CMD --help` (exit 0,
# a "Usage:" line on stdout) and has its section in the man page docs/qkv.1;
# `qkv --version` prints the version.
# Usage: help_and_man.sh QKV_BINARY REPO_ROOT   (needs only bash, grep, sed)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init help_and_man "$@"
MAN=$ROOT/docs/qkv.1

cmds=$("$QKV" --help | sed -n '/^Commands:/,/^$/p' | sed -n 's/^  \([a-z][a-z0-9-]*\).*/\1/p')
[ -n "$cmds" ] || fail "qkv --help lists no commands"
for c in $cmds; do
  out=$("$QKV" "$c" --help 2>/dev/null)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q '^Usage: qkv' <<<"$out"; then
    fail "qkv $c --help: status $rc, no Usage line"
  else
    passed=$((passed + 1))
  fi
  # The man page names each command in bold (hyphens escaped for roff).
  esc=$(sed 's/-/\\\\-/g' <<<"$c")
  if grep -q "^\.B $esc\b" "$MAN" || grep -q "^\.B qkv $esc\b" "$MAN"; then
    passed=$((passed + 1))
  else
    fail "docs/qkv.1 does not describe '$c'"
  fi
done
v=$("$QKV" --version)
if grep -Eq '^qkv [0-9]+\.[0-9]+\.[0-9]+$' <<<"$v" && grep -q "\"qkv ${v#qkv }\"" "$MAN"; then
  passed=$((passed + 1))
else
  fail "qkv --version printed '$v' (the man page's header must carry the same version)"
fi
cli_finish
