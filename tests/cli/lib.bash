# Helpers shared by the CLI test scripts (sourced, never run): the scripts'
# arguments, a scratch folder removed on exit, the pass/fail counters and the
# checks more than one script makes. What only one script checks stays in it.
# Needs bash and coreutils.

# cli_init NAME QKV_BINARY [REPO_ROOT]: sets QKV, ROOT ("" when not given)
# and TMP (a new folder, removed when the script exits); zeroes the counters.
cli_init() {
    local name=$1
    shift
    QKV=${1:?usage: $name.sh QKV_BINARY REPO_ROOT}
    ROOT=${2:-}
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/qkv_$name.XXXXXX") || exit 1
    trap 'rm -rf "$TMP"' EXIT
    # Under -DQKV_VALGRIND=ON (QKV_TEST_VALGRIND: valgrind and its options)
    # every run of the binary goes through valgrind, by a wrapper named qkv
    # in a folder of its own (TMP holds only what the script writes); each
    # process logs to a file there, and cli_finish fails on any that is not
    # empty (an exit status alone would be lost where a script expects a
    # failure anyway).
    VG=
    if [ -n "${QKV_TEST_VALGRIND:-}" ]; then
        VG=$(mktemp -d "${TMPDIR:-/tmp}/qkv_${name}_vg.XXXXXX") || exit 1
        trap "rm -rf '$TMP' '$VG'" EXIT
        printf '#!/bin/sh\nexec %s --log-file="%s/log.%%p" "%s" "$@"\n' "$QKV_TEST_VALGRIND" "$VG" "$QKV" >"$VG/qkv"
        chmod +x "$VG/qkv"
        QKV=$VG/qkv
    fi
    passed=0
    failed=0
}

pass() { passed=$((passed + 1)); }

# fail MESSAGE: counted and printed, with the last run's stderr when it has any.
fail() {
    failed=$((failed + 1))
    echo "FAIL: $*" >&2
    if [ -s "$TMP/stderr" ]; then sed 's/^/    stderr: /' "$TMP/stderr" >&2; fi
}

# check STATUS MESSAGE: passes when STATUS (usually $?) is 0, else fails with MESSAGE.
check() { if [ "$1" = 0 ]; then pass; else fail "$2"; fi; }

# run ARGS...: qkv ARGS; stdout, stderr and the exit status land in
# $TMP/stdout, $TMP/stderr and $rc.
run() {
    "$QKV" "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    rc=$?
}

# npy FILE DESCR SHAPE: FILE exists and its header says this dtype and shape,
# e.g. npy out.npy '<f4' '(4,4)' (spaces in the header are ignored).
npy() {
    local file=$1 descr=$2 shape=$3 header
    if [ ! -f "$file" ]; then
        fail "$file: not written"
        return
    fi
    header=$(head -c 256 "$file" | LC_ALL=C tr -d ' \000')
    case $header in
    *"'descr':'$descr'"*"'shape':$shape"*) pass ;;
    *) fail "$file: header $header, want descr $descr shape $shape" ;;
    esac
}

# same NAME A B / differ NAME A B: the two files are (are not) byte-identical.
same() { if cmp -s "$2" "$3"; then pass; else fail "$1: $2 and $3 differ"; fi; }
differ() { if cmp -s "$2" "$3"; then fail "$1: $2 and $3 are the same"; else pass; fi; }

# is_png FILE: FILE starts with the PNG signature.
is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ]; }

# with_png: whether the qkv under test draws PNG pictures, from
# QKV_TEST_WITH_PNG (1 or 0: CTest sets it from the build's QKV_WITH_PNG).
# Unset, the script stops with a message: a test must not guess which
# build it checks.
with_png() {
    case ${QKV_TEST_WITH_PNG:-} in
    1) return 0 ;;
    0) return 1 ;;
    *)
        echo "QKV_TEST_WITH_PNG is '${QKV_TEST_WITH_PNG:-}': run the test through ctest, or set it to 1 (a build with PNG) or 0" >&2
        exit 1
        ;;
    esac
}

# pictures STDERR FILE...: in a build with PNG every FILE is a PNG picture
# and STDERR does not say "pictures not drawn"; without PNG no FILE exists
# and STDERR says once that pictures are not drawn.
pictures() {
    local err=$1 f
    shift
    if with_png; then
        for f; do if [ -f "$f" ] && is_png "$f"; then pass; else fail "missing or not PNG: $f"; fi; done
        if grep -q "pictures not drawn" "$err"; then fail "$err: 'pictures not drawn' in a build with PNG"; else pass; fi
    else
        for f; do if [ -e "$f" ]; then fail "$f written by a build without PNG"; else pass; fi; done
        [ "$(grep -c "pictures not drawn: this qkv was built without PNG" "$err")" -eq 1 ] && pass \
            || fail "$err: not once 'pictures not drawn: this qkv was built without PNG': $(cat "$err")"
    fi
}

# wait_for_file FILE PID: returns once FILE exists or process PID has ended,
# however long that takes: a fixed bound fails on a loaded machine and under
# valgrind (a first checkpoint there takes tens of seconds), and the test
# that follows says what went wrong if the file never came.
wait_for_file() { while [ ! -f "$1" ] && kill -0 "$2" 2>/dev/null; do sleep 0.01; done; }

# now_ms: milliseconds since the epoch.
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# sleep_within MS: sleeps a random time of 0 .. MS / 2 milliseconds, MS the
# length of a whole run measured on this machine and build: a kill after it
# (and after the run's first checkpoint) lands inside the run. A fixed bound
# let every run of a fast machine end first (a whole run 0.26 s in a
# Release build there) and cut runs under valgrind short.
sleep_within() {
    local ms=$(( RANDOM % ($1 / 2 + 1) ))
    sleep "$(( ms / 1000 )).$(printf %03d $(( ms % 1000 )))"
}

# cli_finish [LABEL]: prints the counts; the script's exit status is the verdict.
cli_finish() {
    local log
    for log in ${VG:+"$VG"/log.*}; do
        if [ -s "$log" ]; then fail "valgrind:"; sed 's/^/    /' "$log" >&2; fi
    done
    echo "${1:+$1: }$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
