#!/usr/bin/env bash
# qkv embed, tokenize, similarity and search on the tiny BERT model of
# tests/data/encoder/tiny (its values against transformers are checked by
# tests/test_cli_encode.c): the shapes written, how a file's lines become
# sentences, a 1 MB line, the cosine matrix, the search order, and every bad
# input refused with a message naming it, a non-zero exit, nothing on stdout
# and nothing left in the output folder.
# Usage: encode_cli.sh QKV_BINARY REPO_ROOT   (needs bash, coreutils, awk)
set -u
. "${BASH_SOURCE%/*}/lib.bash"
cli_init encode_cli "$@"
M=$ROOT/tests/data/encoder/tiny
S=$ROOT/tests/data/encoder/sentences.txt
if [ ! -f "$M/model.safetensors" ] || [ ! -f "$S" ]; then
    echo "FAIL: $M or $S is missing (tests/data/encoder/make_tiny.py writes the model)" >&2
    exit 1
fi

# ---- embed: shapes and lines ------------------------------------------------

run embed --model "$M" --input "$S" -o "$TMP/e.npy"
check $? "embed --input"
npy "$TMP/e.npy" '<f4' '(6,16)'
run embed --model "$M" --text 'Hello, I love you!' --text cat -o "$TMP/two.npy"
check $rc "embed --text twice"
npy "$TMP/two.npy" '<f4' '(2,16)'
run embed --model "$M" --input "$S" --pooling none -o "$TMP/st.npy" --offsets "$TMP/off.npy"
check $rc "embed --pooling none"
npy "$TMP/st.npy" '<f4' '(57,16)'
npy "$TMP/off.npy" '<i8' '(7,)'
run embed --model "$M" --input "$S" --precision int8 -o "$TMP/e8.npy"
check $rc "embed --precision int8"
npy "$TMP/e8.npy" '<f4' '(6,16)'
run embed --model "$M" --input "$S" --precision bf16 -o "$TMP/eb.npy"
check $rc "embed --precision bf16"
npy "$TMP/eb.npy" '<f4' '(6,16)'

# Line 1 and line 6 of the file are the two --text sentences: the same rows.
cut_rows() { tail -c +129 "$1" | head -c $((64 * $3)) | tail -c $((64 * ($3 - $2 + 1))); }
{ cut_rows "$TMP/e.npy" 1 1; cut_rows "$TMP/e.npy" 6 6; } >"$TMP/rows16"
tail -c +129 "$TMP/two.npy" >"$TMP/two16"
# (Equal to float rounding: a batch of two sums its projections in another
# order than the file's six sentences.)
close_floats() {
    paste <(od -An -v -tf4 -w4 "$2") <(od -An -v -tf4 -w4 "$3") |
        awk -v what="$1" '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6) bad = 1; n++ }
            END { exit !(n > 0 && !bad) }' && pass || fail "$1: $2 and $3 differ by more than 1e-6"
}
close_floats "rows 1 and 6 of the file = the two --text runs" "$TMP/rows16" "$TMP/two16"

# CRLF line ends and a missing final newline give the same sentences.
sed 's/$/\r/' "$S" >"$TMP/crlf.txt"
head -c -1 "$S" >"$TMP/nofinal.txt"
run embed --model "$M" --input "$TMP/crlf.txt" -o "$TMP/crlf.npy"
check $rc "embed CRLF file"
same "CRLF lines" "$TMP/e.npy" "$TMP/crlf.npy"
run embed --model "$M" --input "$TMP/nofinal.txt" -o "$TMP/nofinal.npy"
check $rc "embed file without its final newline"
same "no final newline" "$TMP/e.npy" "$TMP/nofinal.npy"
# A file of one newline is one sentence, the empty one (line 3 of sentences.txt).
printf '\n' >"$TMP/nl.txt"
run tokenize --model "$M" --input "$TMP/nl.txt" --tokens
check $rc "tokenize a file of one newline"
[ "$(cat "$TMP/stdout")" = "[CLS] [SEP]" ] && pass || fail "one newline: $(cat "$TMP/stdout"), want [CLS] [SEP]"

# A 1 MB line is truncated like any other (to 24 tokens for this model): its
# vector is that of its first 22 words, and it takes well under a second.
yes 'the ' | tr -d '\n' | head -c 1000000 >"$TMP/big.txt"
echo >>"$TMP/big.txt"
yes 'the ' | tr -d '\n' | head -c 110 >"$TMP/small.txt"
t0=$(date +%s%N)
run embed --model "$M" --input "$TMP/big.txt" -o "$TMP/big.npy"
check $rc "embed a 1 MB line"
t1=$(date +%s%N)
ms=$(((t1 - t0) / 1000000))
echo "embed of a 1 MB line: $ms ms"
# About 0.4 s of CPU (the line is tokenized whole, twice); the bound leaves room
# for a loaded machine, and none under valgrind.
if [ -z "${QKV_TEST_VALGRIND:-}" ] && [ "$ms" -gt 10000 ]; then fail "embed of a 1 MB line took $ms ms"; else pass; fi
run embed --model "$M" --input "$TMP/small.txt" -o "$TMP/small.npy"
check $rc "embed 27 words"
same "1 MB line = its first words" "$TMP/big.npy" "$TMP/small.npy"
run tokenize --model "$M" --input "$TMP/big.txt"
[ "$rc" = 0 ] && [ "$(wc -w <"$TMP/stdout")" = 24 ] && pass || fail "tokenize 1 MB line: exit $rc, $(wc -w <"$TMP/stdout") ids, want 24"
run tokenize --model "$M" --input "$TMP/big.txt" --max-length 5
[ "$(cat "$TMP/stdout")" = "2 87 87 87 3" ] && pass || fail "--max-length 5: '$(cat "$TMP/stdout")'"

# ---- tokenize -----------------------------------------------------------------

run tokenize --model "$M" --text 'Hello, I love you!' --text 'the dogs' --tokens
check $rc "tokenize --tokens"
printf '[CLS] hello , i love you ! [SEP]\n[CLS] the dog ##s [SEP]\n' >"$TMP/want_tokens"
same "word pieces" "$TMP/stdout" "$TMP/want_tokens"
run tokenize --model "$M" --input "$S"
[ "$rc" = 0 ] && [ "$(wc -l <"$TMP/stdout")" = 6 ] && [ "$(head -n 1 "$TMP/stdout")" = "2 120 6 34 122 102 7 3" ] &&
    pass || fail "tokenize --input: exit $rc, $(wc -l <"$TMP/stdout") lines, first '$(head -n 1 "$TMP/stdout")'"

# ---- similarity ---------------------------------------------------------------

run similarity --model "$M" --input "$S"
check $rc "similarity"
# A header, then 6 rows "[i] c1 .. c6 text": symmetric, ones on the diagonal,
# every cosine in [-1, 1].
awk 'NR == 1 { if (NF != 6) bad = "header: " $0; next }
     { if ($1 != "[" NR - 1 "]") bad = "row label " $1
       for (j = 2; j <= 7; j++) { m[NR - 1, j - 1] = $j; if ($j < -1 || $j > 1) bad = "cosine " $j } }
     END { if (NR != 7) bad = NR " lines"
           for (i = 1; i <= 6; i++) { if (m[i, i] != "1.0000") bad = "diagonal " i ": " m[i, i]
             for (j = 1; j <= 6; j++) if (m[i, j] != m[j, i]) bad = "m[" i "," j "] = " m[i, j] " but m[" j "," i "] = " m[j, i] }
           if (bad != "") { print bad; exit 1 } }' "$TMP/stdout" >"$TMP/why"
check $? "similarity matrix: $(cat "$TMP/why")"
grep -q '^\[5\] .*  what is the mean of the soft max of a matrix? we think, we k\.\.\.$' "$TMP/stdout"
check $? "similarity: a long text label is cut with ..."
run similarity --model "$M" --text 'a cat' --text 'a cat'
[ "$rc" = 0 ] && [ "$(sed -n 2p "$TMP/stdout" | awk '{print $2, $3}')" = "1.0000 1.0000" ] &&
    pass || fail "similarity of a text with itself: $(sed -n 2p "$TMP/stdout")"

# ---- search -------------------------------------------------------------------

for line in 1 2 4 5 6; do
    q=$(sed -n "${line}p" "$S")
    run search --model "$M" --corpus "$S" --query "$q" --top 3
    first=$(sed -n 2p "$TMP/stdout")
    if [ "$rc" = 0 ] && [[ $first == "   1.  1.0000  line $line: "* ]] && [ "$(wc -l <"$TMP/stdout")" = 4 ]; then
        pass
    else
        fail "search for line $line: exit $rc, first hit '$first'"
    fi
done
# Two queries, every line (--top past the corpus), best first.
run search --model "$M" --corpus "$S" --query cat --query 'attention is all you need' --top 100
check $rc "search two queries"
awk '/^query/ { q++; prev = 2; next } NF == 0 { next }
     { n[q]++; if ($2 > prev) bad = "not best first: " $0; prev = $2 }
     END { if (q != 2 || n[1] != 6 || n[2] != 6) bad = q " queries, " n[1] " and " n[2] " hits"
           if (bad != "") { print bad; exit 1 } }' "$TMP/stdout" >"$TMP/why"
check $? "search order: $(cat "$TMP/why")"
grep -q '^query 2: attention is all you need$' "$TMP/stdout"
check $? "search: the second query's heading"

# A full stdout is a failure, said as such.
"$QKV" tokenize --model "$M" --input "$S" >/dev/full 2>"$TMP/stderr"
rc=$?
[ "$rc" = 1 ] && grep -q "qkv tokenize: stdout: write error" "$TMP/stderr" && pass || fail "tokenize >/dev/full: exit $rc"
"$QKV" search --model "$M" --corpus "$S" --query cat >/dev/full 2>"$TMP/stderr"
rc=$?
[ "$rc" = 1 ] && grep -q "qkv search: stdout: write error" "$TMP/stderr" && pass || fail "search >/dev/full: exit $rc"

# ---- bad input ------------------------------------------------------------------

mkdir -p "$TMP/nocfg" "$TMP/unsup" "$TMP/adir"
cp "$M/vocab.txt" "$M/model.safetensors" "$TMP/nocfg/"
cp -r "$M/." "$TMP/unsup/"
sed 's/"hidden_act": "gelu"/"hidden_act": "silu"/' "$M/config.json" >"$TMP/unsup/config.json"
printf 'fine\nab\xffcd\n' >"$TMP/bad.txt"
: >"$TMP/empty.txt"
printf 'only one\n' >"$TMP/one.txt"

n=0
# refuse WANT_RC NEEDLE ARGS...: in every argument (and in NEEDLE) @O@ is a
# new empty folder, which must still be empty after the run; the exit status
# must be WANT_RC, stderr must hold NEEDLE and stdout must be empty.
refuse() {
    local want=$1 needle=$2 arg args=()
    shift 2
    n=$((n + 1))
    local dir=$TMP/refuse$n
    mkdir "$dir"
    for arg in "$@"; do args+=("${arg//@O@/$dir}"); done
    needle=${needle//@O@/$dir}
    run "${args[@]}"
    local what="bad input $n (qkv ${args[*]})"
    if [ "$rc" != "$want" ]; then fail "$what: exit $rc, want $want"
    elif ! grep -qF -- "$needle" "$TMP/stderr"; then fail "$what: stderr lacks '$needle'"
    elif [ -s "$TMP/stdout" ]; then fail "$what: stdout: $(head -c 160 "$TMP/stdout")"
    elif [ -n "$(ls -A "$dir")" ]; then fail "$what: left $(ls -A "$dir" | tr '\n' ' ')"
    else pass
    fi
}

E=(embed --model "$M")
refuse 1 "--model $TMP/none: $TMP/none: not a model directory" embed --model "$TMP/none" --text a -o @O@/x.npy
refuse 1 "--model $TMP/nocfg: $TMP/nocfg/config.json: cannot open" embed --model "$TMP/nocfg" --text a -o @O@/x.npy
refuse 1 'hidden_act "silu" is not supported' embed --model "$TMP/unsup" --text a -o @O@/x.npy
refuse 1 'hidden_act "silu" is not supported' tokenize --model "$TMP/unsup" --text a
refuse 1 "--input $TMP/none.txt: cannot open" "${E[@]}" --input "$TMP/none.txt" -o @O@/x.npy
refuse 1 "--input $TMP/bad.txt: line 2 (from byte 5 of the file): invalid UTF-8 at byte 2 (0xFF)" \
    "${E[@]}" --input "$TMP/bad.txt" -o @O@/x.npy
refuse 1 "--input $TMP/bad.txt: line 2 (from byte 5 of the file): invalid UTF-8" tokenize --model "$M" --input "$TMP/bad.txt"
refuse 1 "--input $TMP/bad.txt: line 2" similarity --model "$M" --input "$TMP/bad.txt"
refuse 1 "--corpus $TMP/bad.txt: line 2" search --model "$M" --corpus "$TMP/bad.txt" --query a
refuse 1 "--text: number 2: invalid UTF-8 at byte 1 (0xFF)" "${E[@]}" --text ok --text $'a\xffb' -o @O@/x.npy
refuse 1 "--query: number 1: invalid UTF-8" search --model "$M" --corpus "$S" --query $'\xc3('
refuse 1 "--input $TMP/empty.txt: $TMP/empty.txt holds no sentences" "${E[@]}" --input "$TMP/empty.txt" -o @O@/x.npy
refuse 1 "--corpus $TMP/empty.txt: $TMP/empty.txt holds no sentences" search --model "$M" --corpus "$TMP/empty.txt" --query a
refuse 2 "--pooling: unknown pooling 'sum' (expected mean, cls, max or none)" "${E[@]}" --text a --pooling sum -o @O@/x.npy
refuse 2 "--precision: unknown precision 'int4' (expected fp32, bf16 or int8)" "${E[@]}" --text a --precision int4 -o @O@/x.npy
refuse 2 "--pooling: unknown pooling 'none' (expected mean, cls, max)" similarity --model "$M" --text a --text b --pooling none
refuse 2 "--batch: '0' is out of range" "${E[@]}" --text a --batch 0 -o @O@/x.npy
refuse 2 "--threads: '-1' is out of range" "${E[@]}" --text a --threads -1 -o @O@/x.npy
refuse 1 "-o @O@/no/x.npy: cannot write there: the folder '@O@/no' does not exist" "${E[@]}" --text a -o @O@/no/x.npy
refuse 1 "--offsets @O@/no/o.npy: cannot write there" "${E[@]}" --text a --pooling none -o @O@/x.npy --offsets @O@/no/o.npy
# The second output cannot be written (a folder is in the way): the first is removed again.
refuse 1 "removed @O@/x.npy" "${E[@]}" --text a --pooling none -o @O@/x.npy --offsets "$TMP/adir"
refuse 2 "--top: '0' is out of range" search --model "$M" --corpus "$S" --query a --top 0
refuse 2 "--text: given once: a similarity needs at least 2 texts" similarity --model "$M" --text a
refuse 1 "--input $TMP/one.txt: holds 1 sentence: a similarity needs at least 2" similarity --model "$M" --input "$TMP/one.txt"
refuse 1 "--max-length 100: options: max_length 100 exceeds max_position_embeddings 40" \
    "${E[@]}" --text a --max-length 100 -o @O@/x.npy
refuse 2 "--max-length: '1' is out of range" tokenize --model "$M" --text a --max-length 1
refuse 2 "--input: and --text both give the texts" "${E[@]}" --text a --input "$S" -o @O@/x.npy
refuse 2 "no texts: give --text TEXT (repeatable) or --input FILE" "${E[@]}" -o @O@/x.npy
refuse 2 "missing -o OUT.npy" "${E[@]}" --text a
refuse 2 "missing --model DIR" tokenize --text a
refuse 2 "missing --corpus FILE" search --model "$M" --query a
refuse 2 "missing --query TEXT" search --model "$M" --corpus "$S"
refuse 2 "--offsets: needs --pooling none" "${E[@]}" --text a --offsets @O@/o.npy -o @O@/x.npy
refuse 2 "--no-normalize: applies to pooled vectors" "${E[@]}" --text a --pooling none --no-normalize -o @O@/x.npy
refuse 2 "-o and --offsets name the same file" "${E[@]}" --text a --pooling none -o @O@/x.npy --offsets @O@/x.npy
refuse 2 "-o: given twice" "${E[@]}" --text a -o @O@/x.npy -o @O@/y.npy
refuse 2 "unknown option '--tokens'" "${E[@]}" --text a --tokens -o @O@/x.npy
refuse 2 "Usage: qkv search" search

cli_finish encode_cli
