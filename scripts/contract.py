#!/usr/bin/env python3
"""The SQL surface as each implementation states it, read without a server (issue 54): the
extension's hand-written functions (sql/finalize.sql) and its #[pg_extern]s (src/api/), the
SQL-only edition's headers (sql-only/), the router's wrappers (proxy/, its scripts replayed in
order) and the functions the client packages check grants on. `scripts/check_contract.py`
holds each to contract/functions.json; `--dump` prints the extension's as that file's data.
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Types as PostgreSQL's format_type spells them.
TYPES = {
    "text": "text", "jsonb": "jsonb", "boolean": "boolean", "bool": "boolean", "integer": "integer",
    "int": "integer", "int4": "integer", "bigint": "bigint", "int8": "bigint", "double precision": "double precision",
    "float8": "double precision", "interval": "interval", "timestamptz": "timestamp with time zone",
    "timestamp with time zone": "timestamp with time zone", "uuid": "uuid", "inet": "inet", "void": "void",
    "record": "record",
}
RUST_TYPES = {
    "&str": "text", "String": "text", "f64": "double precision", "i32": "integer", "i64": "bigint", "bool": "boolean",
    "Interval": "interval", "TimestampWithTimeZone": "timestamp with time zone", "pgrx::datum::Uuid": "uuid",
    "Uuid": "uuid", "JsonbArg": "jsonb", "JsonB": "jsonb", "pgrx::JsonB": "jsonb",
}


def sql_type(t):
    t = " ".join(t.strip().split())
    low = t.lower()
    if low in TYPES:
        return TYPES[low]
    return low.replace("rate_limiter_proxy.", "rate_limiter.")


def default(d):
    """A default as written, without its cast and quotes on a number: NULL, 1, false, 'all'."""
    if d is None:
        return None
    d = " ".join(d.strip().split())
    d = re.sub(r"::[a-z_. ]+$", "", d, flags=re.I)
    if d.upper() == "NULL":
        return "NULL"
    if re.fullmatch(r"'-?[0-9.]+'", d):
        d = d[1:-1]
    return d.lower() if d.lower() in ("true", "false") else d


def split_top(text, sep=",", quotes="'"):
    """`text` split at `sep` outside parentheses, brackets and `quotes`."""
    parts, depth, quote, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch in quotes:
            quote = not quote
        elif not quote and ch in "([{<":
            depth += 1
        elif not quote and ch in ")]}>":
            depth -= 1
        elif not quote and depth == 0 and ch == sep:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def sql_args(text):
    args = []
    for part in split_top(re.sub(r"/\*.*?\*/|--[^\n]*", "", text, flags=re.S)):
        out = re.match(r"OUT\s+(.*)$", part, re.I | re.S)
        m = re.match(r'"?([a-z_][a-z0-9_]*)"?\s+(.*?)(?:\s+(?:DEFAULT|=)\s+(.*))?$', out.group(1) if out else part, re.I | re.S)
        if not m or sql_type(m.group(1)) in TYPES.values():  # an argument without a name
            args.append(["", sql_type(part), None])
            continue
        args.append([m.group(1), sql_type(m.group(2)), default(m.group(3))] + (["out"] if out else []))
    return args


FUNCTION = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(rate_limiter(?:_proxy)?)\.\"?([a-z_][a-z0-9_]*)\"?\s*\(((?:(?!\$\$|CREATE\s).)*?)\)\s*"
    r"(?:RETURNS\s+(.*?)\s+)?(?=LANGUAGE|AS\b|VOLATILE|STABLE|IMMUTABLE)((?:(?!\$\$|CREATE\s).)*?)(?:\bAS\b|\bRETURN\b|\bBEGIN\s+ATOMIC\b)",
    re.I | re.S)


def sql_functions(text, schema="rate_limiter"):
    """Every function `text` creates in `schema`, in order: name, arguments, result, flags."""
    found = []
    for m in FUNCTION.finditer(text):
        if m.group(1) != schema:
            continue
        rest = m.group(5).upper()
        found.append({
            "name": m.group(2),
            "args": sql_args(m.group(3)),
            "returns": returns_of(m.group(4)),
            "volatility": next((v.lower() for v in ("IMMUTABLE", "STABLE") if re.search(rf"\b{v}\b", rest)), "volatile"),
            "parallel": (re.search(r"PARALLEL\s+(SAFE|RESTRICTED|UNSAFE)", rest) or [None, "UNSAFE"])[1].lower(),
            "security_definer": "SECURITY DEFINER" in rest,
        })
    return found


def returns_of(text):
    if text is None:
        return "record"  # OUT arguments
    text = " ".join(text.split())
    m = re.match(r"TABLE\s*\((.*)\)$", text, re.I | re.S)
    if m:
        return "TABLE(" + ", ".join(f"{n} {t}" for n, t, _ in sql_args(m.group(1))) + ")"
    if text.upper().startswith("SETOF "):
        return "SETOF " + sql_type(text[6:])
    return sql_type(text)


def rust_type(t):
    t = " ".join(t.split())
    m = re.fullmatch(r"default!\((.*),\s*(.*)\)", t, re.S)
    if m:
        return rust_type(m.group(1))[0], default(m.group(2).strip().strip('"'))
    m = re.fullmatch(r"Option<(.*)>", t)
    if m:
        return rust_type(m.group(1))
    m = re.search(r'composite_type!\(\s*\'\w+\s*,\s*"([^"]+)"\s*\)', t)
    if m:
        return m.group(1), None
    t = re.sub(r"&'\w+ str", "&str", t)
    return RUST_TYPES.get(t, t), None


def rust_functions():
    """The #[pg_extern]s of src/api/ that make SQL, as `sql_functions` gives them."""
    found = []
    extern = re.compile(r"#\[pg_extern\(([^)]*)\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub\s+)?fn\s+(\w+)(?:<[^>]*>)?\s*\((.*?)\)\s*(?:->\s*(.*?))?\s*\{",
                        re.S)
    for f in sorted((ROOT / "src" / "api").glob("*.rs")):
        text = re.sub(r"//[^\n]*", "", f.read_text())
        for m in extern.finditer(text):
            flags = [x.strip() for x in m.group(1).split(",")]
            if "sql = false" in flags:
                continue
            name = next((x.split("=")[1].strip().strip('"') for x in flags if x.startswith("name")), m.group(2))
            args = []
            for part in split_top(m.group(3), quotes='"'):
                arg, typ = part.split(":", 1)
                t, d = rust_type(typ)
                args.append([arg.strip(), t, d])
            found.append({
                "name": name,
                "args": args,
                "returns": rust_returns(m.group(4)),
                "volatility": next((v for v in ("immutable", "stable") if v in flags), "volatile"),
                "parallel": next((p.split("_")[1] for p in flags if p.startswith("parallel_")), "unsafe"),
                "security_definer": "security_definer" in flags,
            })
    return found


def rust_returns(t):
    if not t:
        return "void"
    t = " ".join(t.split())
    m = re.fullmatch(r"TableIterator<\s*'static\s*,\s*\((.*)\)\s*,?\s*>", t)
    if m:
        cols = [re.fullmatch(r"name!\((\w+),\s*(.*)\)", c.strip()) for c in split_top(m.group(1), quotes='"')]
        return "TABLE(" + ", ".join(f"{c.group(1)} {rust_type(c.group(2))[0]}" for c in cols) + ")"
    return rust_type(t)[0]


def extension():
    """The extension's public functions (no leading underscore) and `_`-prefixed helpers."""
    return sql_functions((ROOT / "sql" / "finalize.sql").read_text()) + rust_functions()


def edition():
    """The SQL-only edition's functions, as its install script creates them."""
    return sql_functions((ROOT / "sql-only" / "rate_limiter.sql").read_text())


def router():
    """The router's functions after its install path (0.4.0, then each update up to the
    control file's default_version, as CREATE EXTENSION runs them), last one wins."""
    control = (ROOT / "proxy" / "rate_limiter_proxy.control").read_text()
    default = re.search(r"^default_version = '([^']+)'", control, re.M).group(1)
    scripts, version = ["rate_limiter_proxy--0.4.0.sql"], "0.4.0"
    while version != default:
        (update,) = (ROOT / "proxy").glob(f"rate_limiter_proxy--{version}--*.sql")
        scripts.append(update.name)
        version = update.name.removesuffix(".sql").split("--")[2]
    functions = {}
    for script in scripts:
        text = (ROOT / "proxy" / script).read_text()
        for dropped in re.findall(r"DROP FUNCTION (?:IF EXISTS )?rate_limiter_proxy\.(\w+)", text):
            functions.pop(dropped, None)
        for f in sql_functions(text, "rate_limiter_proxy"):
            functions[f["name"]] = f
    return list(functions.values())


def clients():
    """The functions each client package checks grants on: {package: {"always": names,
    "with": names checked only when an option needs them}}."""
    python = (ROOT / "clients" / "python" / "src" / "rate_limiter_postgres" / "_limits_common.py").read_text()
    needed = re.search(r"NEEDED_GRANTS\s*=\s*\{(.*?)\}", python, re.S).group(1)
    found = {"python limits storage": {"always": set(re.findall(r'"(\w+)":', needed)), "with": set()}}
    for store in ("express", "fastify", "flexible"):
        text = (ROOT / "clients" / "node" / "src" / f"{store}.ts").read_text()
        grants = re.search(r"new Grants\(.*?\(\)\s*=>\s*\((\{.*?\})\)\)", text, re.S).group(1)
        optional = re.findall(r"\?\s*\{\s*(\w+):", grants)
        named = re.findall(r"(?:^|[{,\s])(\w+):", grants)
        found[f"node {store}"] = {"always": set(named) - set(optional), "with": set(optional)}
    return found


def client_readmes():
    """The grants each client's README asks for: {package: {"always": names, "with": names}}."""
    node = (ROOT / "clients" / "node" / "README.md").read_text()
    stores = {"express-rate-limit": "node express", "@fastify/rate-limit": "node fastify", "rate-limiter-flexible": "node flexible"}
    found = {}
    for m in re.finditer(r"^\| ([@\w/-]+) \| (.*?) \| (.*?) \|$", node, re.M):
        if m.group(1) in stores:
            found[stores[m.group(1)]] = {"always": set(re.findall(r"`(\w+)`", m.group(2))),
                                         "with": set(re.findall(r"`(\w+)`", m.group(3)))}
    python = (ROOT / "clients" / "python" / "README.md").read_text()
    m = re.search(r"needs `USAGE` on the schema and `EXECUTE` on (.*?)\. The\s+storage checks the first two", python, re.S)
    named = re.findall(r"`(\w+)`", m.group(1)) if m else []
    found["python limits storage"] = {"always": set(named[:2]), "with": set(named[2:])}
    return found


if __name__ == "__main__" and "--dump" in sys.argv:
    print(json.dumps(sorted(extension(), key=lambda f: f["name"]), indent=1))


# Errors: SQLSTATEs by the names pgrx gives them.
SQLSTATES = {
    "INVALID_PARAMETER_VALUE": "22023", "UNDEFINED_OBJECT": "42704", "UNDEFINED_TABLE": "42P01", "FOREIGN_KEY_VIOLATION": "23503", "FEATURE_NOT_SUPPORTED": "0A000",
    "INVALID_TEXT_REPRESENTATION": "22P02", "T_R_SERIALIZATION_FAILURE": "40001",
    "OBJECT_NOT_IN_PREREQUISITE_STATE": "55000", "DATETIME_FIELD_OVERFLOW": "22008",
    "INSUFFICIENT_PRIVILEGE": "42501", "CONFIGURATION_LIMIT_EXCEEDED": "53400", "UNDEFINED_COLUMN": "42703",
}


def rust_string(literal):
    """A Rust string literal's text: escapes, and a backslash at a line's end joins lines."""
    text = re.sub(r"\\\n\s*", "", literal)
    return text.replace('\\"', '"').replace("\\\\", "\\")


def rust_arms(body, value):
    """{variant: value} of the arms of a `match self` body, `value` a pattern of the arm's value."""
    arms = {}
    arm = re.compile(r"((?:Error::\w+(?:\s*\{\s*\.\.\s*\}|\(_\))?\s*\|?\s*)+)=>\s*\{?\s*" + value, re.S)
    for m in arm.finditer(body):
        for variant in re.findall(r"Error::(\w+)", m.group(1)):
            arms[variant] = m.group(2)
    return arms


def rust_errors():
    """src/error.rs's errors: {variant: {sqlstate, message, hint}}, a message's arguments as %."""
    text = (ROOT / "src" / "error.rs").read_text()
    enum = text[text.index("pub enum Error {"):text.index("impl Error {")]
    messages = {m.group(2): re.sub(r"\{[^{}]*\}", "%", rust_string(m.group(1)))
                for m in re.finditer(r'#\[error\("((?:[^"\\]|\\.)*)"[^\]]*\)\]\s*(\w+)', enum)}
    sqlstate_body = text[text.index("fn sqlstate("):text.index("fn hint(")]
    hint_body = text[text.index("fn hint("):text.index("pub fn raise(")]
    states = rust_arms(sqlstate_body, r"PgSqlErrorCode::ERRCODE_(\w+)")
    hints = rust_arms(hint_body, r'"((?:[^"\\]|\\.)*)"')
    return {v: {"sqlstate": SQLSTATES.get(states.get(v), states.get(v)), "message": messages[v],
                "hint": rust_string(hints[v]) if v in hints else None} for v in messages}


def edition_errors():
    """sql-only's `_raise` kinds: {kind: {sqlstate, message, hint}}, as PostgreSQL prints them."""
    text = (ROOT / "sql-only" / "api.sql").read_text()
    body = text[text.index("CREATE FUNCTION rate_limiter._raise("):]
    body = body[:body.index("END CASE;")]
    found = {}
    for m in re.finditer(r"WHEN '(\w+)' THEN(.*?)(?=WHEN '\w+' THEN|$)", body, re.S):
        raise_ = re.search(r"RAISE EXCEPTION '((?:[^']|'')*)'.*?ERRCODE = '(\w+)'.*?HINT = '((?:[^']|'')*)'", m.group(2), re.S)
        found[m.group(1)] = {"sqlstate": raise_.group(2), "message": raise_.group(1).replace("''", "'"),
                             "hint": raise_.group(3).replace("''", "'")}
    return found


# Settings: src/settings.rs's statics and their GucRegistry calls.
CONTEXTS = {"Suset": "superuser", "Sighup": "reload", "Postmaster": "restart", "Userset": "anyone"}


def settings():
    """{name: {default, context, unit}} of every setting src/settings.rs registers."""
    text = (ROOT / "src" / "settings.rs").read_text()
    defaults = {m.group(1): m.group(2) for m in re.finditer(r"pub static (\w+): GucSetting<[^=]*= GucSetting::<[^>]*>>?::new\((.*?)\);", text)}
    found = {}
    for m in re.finditer(r'define_\w+_guc\(\s*c"(rate_limiter\.\w+)",.*?&(\w+),(.*?)GucContext::(\w+),\s*GucFlags::(\w+)', text, re.S):
        # An enum's default is its variant (`ThrowAs::RL429`): the value's name.
        default = defaults[m.group(2)].rsplit("::", 1)[-1].replace("_", "")
        found[m.group(1)] = {"default": "" if default == "None" else default, "context": CONTEXTS[m.group(4)],
                             "unit": {"UNIT_S": "s", "UNIT_MS": "ms"}.get(m.group(5))}
    return found


def documented():
    """docs/api.md's signature lines: `rate_limiter.f(arguments with types) RETURNS type`."""
    api = (ROOT / "docs" / "api.md").read_text()
    line = re.compile(r"rate_limiter\.(\w+)\(((?:[^()]|\([^()]*\))*)\)\s*RETURNS\s+([\w. ]+?(?:\([^)]*\))?)"
                      r"(?=\s*(?:`|\n|$|;| gives| forgets| deletes| zeroes))", re.S)
    typed = re.compile(r"\w+\s+(text|jsonb|double precision|boolean|integer|interval|timestamptz|uuid|inet|rate_limiter\.decision)")
    return [{"name": m.group(1), "args": sql_args(m.group(2)), "returns": returns_of(m.group(3))}
            for m in line.finditer(api) if typed.search(m.group(2))]
