"""What an attacker plants to find out whether its code ran with another role's rights: a
sequence that each trap bumps when it runs as anyone but the attacker (nextval survives a
rolled-back transaction), and that tries `ALTER ROLE attacker SUPERUSER` as it does."""


def trap_runs(conn, counter):
    """How often the traps of `counter` ran as another role."""
    last, called = conn.execute(f"SELECT last_value, is_called FROM {counter}").fetchone()
    return last if called else 0


def trap_counter(conn, schema, name):
    """The sequence `schema.name` the traps bump, which every role may bump."""
    counter = f"{schema}.{name}"
    conn.execute(f"CREATE SEQUENCE {counter}")
    conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
    conn.execute(f"GRANT ALL ON SEQUENCE {counter} TO PUBLIC")
    return counter


def trap_body(attacker, counter, result):
    """A PL/pgSQL function's body ($$ ... $$) that springs the trap and returns `result`."""
    return f"""$$
            BEGIN
                IF current_user OPERATOR(pg_catalog.<>) '{attacker}' THEN
                    PERFORM pg_catalog.nextval('{counter}');
                    BEGIN
                        EXECUTE 'ALTER ROLE {attacker} SUPERUSER';
                    EXCEPTION WHEN OTHERS THEN NULL;
                    END;
                END IF;
                RETURN {result};
            END $$"""


def plant_trigger_traps(conn, role):
    """`role` (conn's) plants, in its own schema of that name, `{role}.trap()`, a trigger
    function, and `{role}.when_trap()`, a boolean for a trigger's WHEN; returns the sequence
    they bump."""
    counter = trap_counter(conn, role, "runs")
    conn.execute(f"CREATE FUNCTION {role}.trap() RETURNS trigger LANGUAGE plpgsql AS {trap_body(role, counter, 'NULL')}")
    conn.execute(f"CREATE FUNCTION {role}.when_trap() RETURNS boolean LANGUAGE plpgsql AS {trap_body(role, counter, 'true')}")
    return counter
