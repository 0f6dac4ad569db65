#!/usr/bin/env bash
# The contract's vectors (contract/vectors.json) replayed by the SQL-only edition on a stock
# PostgreSQL: `bash scripts/edition_vectors.sh [15|16|17|18]` makes a cluster of its own that
# never loads the extension (nothing of it need be built), installs sql-only/rate_limiter.sql as a database's owner,
# runs contract/replay.sql's calls and fails on any answer that differs from the file's; the
# cluster is removed after. Tier 1 of the test command runs it on every version.
source "$(dirname "$0")/lib.sh"
NN=${1:-15}
bin=$(pg_bin "$NN") dir=/tmp/rate_limiter_vectors_$NN port=$((5465 + NN))
server() { sudo -u postgres "$bin/pg_ctl" -D "$dir" "$@" >/dev/null; }
as_root rm -rf "$dir" && as_root mkdir -p "$dir" && as_root chown postgres: "$dir"
sudo -u postgres "$bin/initdb" -D "$dir" -A trust -U postgres --no-sync >/dev/null
trap 'server -m immediate stop 2>/dev/null || true; as_root rm -rf "$dir"' EXIT
server -l "$dir/server.log" -w start -o "-p $port -k /tmp -c listen_addresses= -c fsync=off"
# As the edition is installed: by the database's owner, no superuser.
"$bin/psql" -X -q -h /tmp -p "$port" -U postgres -d postgres -c "CREATE ROLE owner LOGIN" -c "CREATE DATABASE edition OWNER owner"
sql() { "$bin/psql" -X -q -At -v ON_ERROR_STOP=1 -h /tmp -p "$port" -U owner -d edition "$@"; }
sql -f "$ROOT/sql-only/rate_limiter.sql" >/dev/null
with_vectors() { sql -v vectors="$(cat "$ROOT/contract/vectors.json")" -f -; }
mismatches=$({ cat "$ROOT/contract/replay.sql"
               echo "SELECT format('%s, step %s: expected %s, answered %s', about, step, expected, answered)"
               echo "  FROM pg_temp.vector_mismatches(:'vectors');"
             } | with_vectors)
cases=$(echo "SELECT count(*) FROM jsonb_array_elements(:'vectors'::jsonb -> 'cases');" | with_vectors)
if [ -n "$mismatches" ]; then
    printf 'the SQL-only edition on PostgreSQL %s differs from contract/vectors.json:\n%s\n' "$NN" "$mismatches" >&2
    exit 1
fi
server -w -m fast stop
check_server_log "$dir/server.log" "the edition's cluster on PostgreSQL $NN"
echo "the SQL-only edition on a stock PostgreSQL $NN gives the answers of the $cases cases of contract/vectors.json"
