"""Everything an extension creates, described by value (no OIDs), one row per object: what
an update must leave exactly as a fresh install makes it (functions with their settings,
owners, privileges and bodies; relations, types, columns, indexes, constraints, triggers;
the extension's members, initial privileges and row). An ACL left to PostgreSQL's default
shows as that default, which it means."""

CATALOG = """
WITH ns AS (SELECT (SELECT extnamespace FROM pg_extension WHERE extname = %(extension)s) AS oid),
members AS (SELECT d.classid, d.objid, d.objsubid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
             WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = %(extension)s)
SELECT 'function', p.oid::regprocedure::text,
       concat_ws(' ', l.lanname, p.proowner::regrole, p.provolatile, p.proparallel, p.prosecdef, p.proisstrict,
                 p.proleakproof, pg_get_function_result(p.oid), pg_get_function_arguments(p.oid), p.proconfig::text,
                 coalesce(p.proacl, acldefault('f', p.proowner))::text, md5(p.prosrc), obj_description(p.oid, 'pg_proc'))
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang, ns WHERE p.pronamespace = ns.oid
UNION ALL
SELECT 'relation', c.relname,
       concat_ws(' ', c.relkind, c.relowner::regrole, c.reloptions::text, c.relreplident, c.relrowsecurity,
                 coalesce(c.relacl, acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner))::text,
                 obj_description(c.oid, 'pg_class'))
FROM pg_class c, ns WHERE c.relnamespace = ns.oid
UNION ALL
SELECT 'type', t.typname, concat_ws(' ', t.typtype, t.typowner::regrole,
                                     coalesce(t.typacl, acldefault('T', t.typowner))::text, obj_description(t.oid, 'pg_type'))
FROM pg_type t, ns WHERE t.typnamespace = ns.oid
UNION ALL
SELECT 'column', c.relname || '.' || a.attname,
       concat_ws(' ', format_type(a.atttypid, a.atttypmod), co.collname, a.attnotnull, a.attnum, a.attacl::text,
                 pg_get_expr(d.adbin, d.adrelid), col_description(c.oid, a.attnum))
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_collation co ON co.oid = a.attcollation
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum, ns
WHERE c.relnamespace = ns.oid
UNION ALL
SELECT 'index', i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid, ns WHERE c.relnamespace = ns.oid
UNION ALL
SELECT 'constraint', c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c, ns WHERE c.connamespace = ns.oid
UNION ALL
SELECT 'trigger', t.tgname, concat_ws(' ', pg_get_triggerdef(t.oid), t.tgenabled)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid, ns WHERE c.relnamespace = ns.oid AND NOT t.tgisinternal
UNION ALL
SELECT 'member', pg_describe_object(classid, objid, objsubid), '' FROM members
UNION ALL
SELECT 'initial privileges', pg_describe_object(i.classoid, i.objoid, i.objsubid), concat_ws(' ', i.privtype, i.initprivs::text)
FROM pg_init_privs i JOIN members m ON (m.classid, m.objid, m.objsubid) = (i.classoid, i.objoid, i.objsubid)
WHERE %(initial_privileges)s
UNION ALL
SELECT 'extension', extname, concat_ws(' ', extversion, extnamespace::regnamespace, extrelocatable,
                                       extconfig::regclass[]::text, extcondition::text,
                                       obj_description(oid, 'pg_extension'))
FROM pg_extension WHERE extname = %(extension)s
ORDER BY 1, 2, 3
"""


def catalog_of(conn, extension, initial_privileges=True):
    """The rows of CATALOG; `initial_privileges=False` leaves out pg_init_privs, where
    PostgreSQL records every GRANT an update script makes (such as one giving back a grant
    on a function the update created again) as the extension's own."""
    return conn.execute(CATALOG, {"extension": extension, "initial_privileges": initial_privileges}).fetchall()


def default_privileges(conn, role, schema=None):
    """ALTER DEFAULT PRIVILEGES giving `role` what can be given on every new object (in
    `schema` as well, when given) of the connected user."""
    for where in ("", f"IN SCHEMA {schema}") if schema else ("",):
        conn.execute(f"ALTER DEFAULT PRIVILEGES {where} GRANT EXECUTE ON FUNCTIONS TO {role}; "
                     f"ALTER DEFAULT PRIVILEGES {where} GRANT SELECT, INSERT ON TABLES TO {role}; "
                     f"ALTER DEFAULT PRIVILEGES {where} GRANT USAGE ON TYPES TO {role}; "
                     f"ALTER DEFAULT PRIVILEGES {where} GRANT USAGE ON SEQUENCES TO {role}")
    conn.execute(f"ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO {role}")


def granted_to(conn, schema, role):
    """(object, privilege) of every grant to `role` on `schema` and the objects in it."""
    return conn.execute("""
        SELECT what, a.privilege_type FROM (
            SELECT p.oid::regprocedure::text, p.proacl FROM pg_proc p WHERE p.pronamespace = %(schema)s::regnamespace
            UNION ALL SELECT c.oid::regclass::text, c.relacl FROM pg_class c WHERE c.relnamespace = %(schema)s::regnamespace
            UNION ALL SELECT t.oid::regtype::text, t.typacl FROM pg_type t WHERE t.typnamespace = %(schema)s::regnamespace
            UNION ALL SELECT nspname::text, nspacl FROM pg_namespace WHERE nspname = %(schema)s::text) o (what, acl),
            aclexplode(o.acl) a WHERE a.grantee = %(role)s::regrole ORDER BY 1, 2""", {"schema": schema, "role": role}).fetchall()
