#!/usr/bin/env bash
# The #[pg_test]s (tier 2) on the assert-enabled server (scripts/servers.sh's ASSERT_MAJOR,
# built with Valgrind's client requests) with every server process under Valgrind's memcheck
# and PostgreSQL's own suppressions (src/tools/valgrind.supp of the server's pinned source).
# An error is an invalid read or write, a jump on uninitialised memory, or a chunk of a memory
# context touched after it was freed; a leak counts when it is definite and one of its frames
# is the extension's. Prints the figures and the first error of each kind, and fails on any.
# Too slow for the test command: 5 to 9 minutes on two cores, against tier 2's minute or so.
# Usage: bash bench/valgrind.sh [cargo pgrx test filter]
source "$(dirname "$0")/../scripts/lib.sh"
NN=$ASSERT_MAJOR
WORK=/tmp/rate_limiter_valgrind
LOGS=$WORK/logs # one file per process, written by postgres
setup "$NN"
install_debian_packages valgrind
as_root rm -rf "$WORK" && mkdir -p "$WORK" && as_root install -d -o postgres "$LOGS"

# PostgreSQL's suppressions, from the server's own pinned source.
(cd "$WORK" && fetch_source "$(pg_sources "$NN" | head -n 1)" >/dev/null \
    && tar xjf source.tar.bz2 --wildcards '*/src/tools/valgrind.supp' --strip-components=3 && rm source.tar.bz2)
[ -s "$WORK/valgrind.supp" ] || { echo "no valgrind.supp in PostgreSQL $NN's source" >&2; exit 1; }

# A copy of the server whose postgres runs under memcheck (pg_ctl starts the postgres beside
# it), known to pgrx through a PGRX_HOME of its own: the cached server is left as it is.
cp -a "$(pg_prefix "$NN")" "$WORK/server"
mv "$WORK/server/bin/postgres" "$WORK/server/bin/postgres.real"
cat > "$WORK/server/bin/postgres" <<EOF
#!/bin/sh
exec valgrind --quiet --trace-children=yes --track-origins=yes --read-var-info=yes --num-callers=30 \\
    --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \\
    --suppressions=$WORK/valgrind.supp --error-markers=VALGRINDERROR-BEGIN,VALGRINDERROR-END \\
    --log-file=$LOGS/%p.log "$WORK/server/bin/postgres.real" "\$@"
EOF
chmod 755 "$WORK/server/bin/postgres" && as_root chmod -R a+rX "$WORK"
mkdir -p "$WORK/pgrx"
# Its own test port, clear of a test command running meanwhile (pgrx's is 32200 + major).
printf 'base_testing_port = 33200\n[configs]\npg%s = "%s"\n' "$NN" "$WORK/server/bin/pg_config" > "$WORK/pgrx/config.toml"

as_root mkdir -p /tmp/rate_limiter_valgrind_data && as_root chown postgres: /tmp/rate_limiter_valgrind_data
started=$(date +%s)
status=0
(cd "$ROOT" && PGRX_HOME="$WORK/pgrx" CARGO_PGRX_DISABLE_GC_SECTIONS_WORKAROUND=1 RUST_TEST_THREADS=2 \
    cargo pgrx test "pg$NN" --runas postgres --pgdata /tmp/rate_limiter_valgrind_data/pg$NN "$@") > "$WORK/tests.log" 2>&1 || status=$?
seconds=$(( $(date +%s) - started ))

# Each process's log, block by block (between the error markers): an error is any block that
# is not a leak; a definite leak is the extension's when one of the first four frames of its
# allocation is (the server's own, such as the relcache's strings of an index opened under
# the extension's call, are left to the server).
summary=$(cat "$LOGS"/*.log | awk '/VALGRINDERROR-BEGIN/ { on = 1; leak = 0; frames = 0; mine = 0; next }
    /VALGRINDERROR-END/ { on = 0; if (leak) { if (mine) leaks++; else theirs++ } else errors++; next }
    on && /definitely lost/ { leak = 1 }
    on && /(at|by) 0x/ && frames++ < 4 && /rate_limiter::|rate_limiter\.so/ { mine = 1 }
    END { printf "%d %d %d\n", errors, leaks, theirs }')
read -r errors leaks server_leaks <<<"$summary"
processes=$(ls "$LOGS" | wc -l)
# Summed over cargo's test binaries (the library's, then an empty one).
passed=$(awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed", p, f }' "$WORK/tests.log")
echo "PostgreSQL $NN (assert-enabled) under memcheck: $(minutes_seconds "$seconds") for the pg_tests ($passed), exit status $status"
echo "$processes server processes traced; $errors errors; $leaks definite leaks through the extension's frames ($server_leaks of the server's own)"
if [ "$errors" != 0 ]; then
    echo "first errors:"
    cat "$LOGS"/*.log | awk '/VALGRINDERROR-BEGIN/ { on = 1; block = "" } on { block = block "\n" $0 }
        /VALGRINDERROR-END/ { on = 0; if (block !~ /definitely lost/ && n++ < 3) print block }'
fi
[ "$status" = 0 ] && [ "$errors" = 0 ] && [ "$leaks" = 0 ]
