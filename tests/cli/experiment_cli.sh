#!/usr/bin/env bash
# `qkv experiment`: every experiment in --quick mode (seconds) prints its
# table and writes its PNG (without PNG: none, said once); usage errors
# exit 2, an unusable --out exits 1.
# The full-size runs and their numbers are in docs/EXPERIMENTS.md.
# Usage: experiment_cli.sh QKV_BINARY REPO_ROOT   (needs only bash and coreutils)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init experiment_cli "$@"

check() { # NAME PICTURE... : run it, expect a table header and its pictures
    local name=$1
    shift
    "$QKV" experiment "$name" --quick --threads 1 --out "$TMP/out" >"$TMP/o" 2>"$TMP/e"
    local rc=$?
    [ "$rc" -eq 0 ] && [ -z "$(grep -v "pictures not drawn" "$TMP/e")" ] && pass || fail "$name: exit $rc, $(cat "$TMP/e")"
    grep -q "^qkv experiment $name (seed 1, quick)" "$TMP/o" && grep -q "^Measured" "$TMP/o" && pass \
        || fail "$name: no table or summary"
    pictures "$TMP/e" "${@/#/$TMP/out/}"
    for f in "$@"; do
        if with_png; then grep -q "wrote $TMP/out/$f" "$TMP/o"; else ! grep -q "wrote " "$TMP/o"; fi
        [ $? -eq 0 ] && pass || fail "$name: 'wrote $f' printed exactly when drawn"
    done
}
check scale experiment_scale.png experiment_scale_grad.png
grep -q "^   512 |" "$TMP/o" && fail "quick scale went to d = 512" || pass
check projections experiment_projections.png
grep -q "^recall .* | learned" "$TMP/o" && grep -q "| identity" "$TMP/o" && pass || fail "projections rows"
check diagonal experiment_diagonal.png
check position experiment_position.png
for k in none sinusoidal learned rope alibi relative floater; do
    grep -q "^$k " "$TMP/o" && pass || fail "position: no row for $k"
done
check heads experiment_heads.png
[ "$(grep -cE '^ +[1248] +[0-9]+ \|' "$TMP/o")" -eq 4 ] \
    && [ "$(grep -E '^ +[1248] +[0-9]+ \|' "$TMP/o" | cut -d'|' -f2 | sort -u | wc -l)" -eq 1 ] \
    && pass || fail "heads: four rows with equal parameter counts"
# The name may follow the options; the same seed gives the same table.
"$QKV" experiment --quick --threads 1 --out "$TMP/out2" heads >"$TMP/o2" 2>&1
cmp -s <(grep '|' "$TMP/o" | cut -d'|' -f1-3) <(grep '|' "$TMP/o2" | cut -d'|' -f1-3) && pass \
    || fail "heads: same seed, different table"

expect() {
    local want=$1
    shift
    "$QKV" experiment "$@" >"$TMP/o" 2>"$TMP/e"
    local rc=$?
    [ "$rc" -eq "$want" ] && grep -q "^qkv experiment: " "$TMP/e" && pass || fail "experiment $*: exit $rc, $(cat "$TMP/e")"
}
expect 2
expect 2 magic --quick
expect 2 scale --seed x
expect 2 scale --threads -1
expect 2 scale --bogus
expect 2 scale --out ""
touch "$TMP/file"
expect 1 scale --quick --out "$TMP/file"
# A picture that cannot be written: exit 1, the other one removed.
if with_png; then
    mkdir -p "$TMP/blk/experiment_scale_grad.png"
    expect 1 scale --quick --threads 1 --out "$TMP/blk"
    [ "$(ls -A "$TMP/blk")" = "experiment_scale_grad.png" ] && pass || fail "left behind: $(ls -A "$TMP/blk" | tr '\n' ' ')"
fi
"$QKV" experiment --help | grep -q "^Usage: qkv experiment" && pass || fail "--help"

cli_finish experiment_cli
