#!/usr/bin/env python3
"""Every implementation of the SQL surface held to contract/functions.json and
contract/errors.json (issue 54), with no server and no build: the extension (sql/finalize.sql,
the #[pg_extern]s of src/api/, src/error.rs), the SQL-only edition (its install script and its
_raise), the router's wrappers, the functions the client packages check grants on, and
docs/api.md. Prints each difference; exit 1 when there is any."""
import json
import re
import sys
from pathlib import Path

import contract

ROOT = contract.ROOT
CONTRACT = json.loads((ROOT / "contract" / "functions.json").read_text())
FIELDS = ("args", "returns", "volatility", "parallel")
UNITS = {"second": 1, "seconds": 1, "minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}


def same_default(a, b):
    """Equal as written, or as intervals ('30 seconds' and '00:00:30')."""
    if a == b:
        return True

    def seconds(d):
        d = (d or "").strip("'")
        m = re.fullmatch(r"(\d+):(\d\d):(\d\d)", d)
        if m:
            return int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
        m = re.fullmatch(r"(\d+) (\w+)", d)
        return int(m[1]) * UNITS[m[2]] if m and m[2] in UNITS else None
    return seconds(a) is not None and seconds(a) == seconds(b)


def differences(expected, found, fields=FIELDS):
    out = []
    for field in fields:
        want, have = expected[field], found[field]
        if field == "args":
            same = len(want) == len(have) and all(
                w[:2] == h[:2] and w[3:] == h[3:] and same_default(w[2], h[2]) for w, h in zip(want, have))
        else:
            same = want == have
        if not same:
            out.append(f"{field}: contract {want!r}, found {have!r}")
    return out


def check(label, found, wanted, fields=FIELDS, extra_allowed=(), overrides=None):
    """`found` (a list of functions) against the contract's `wanted` ones."""
    problems = []
    by_name = {}
    for f in found:
        by_name[f["name"]] = f
    for name, expected in wanted.items():
        if name not in by_name:
            problems.append(f"{label}: {name} is in the contract but not here")
            continue
        expected = {**expected, **(overrides or {}).get(name, {})}
        problems += [f"{label}: {name}: {d}" for d in differences(expected, by_name[name], fields)]
    for name in sorted(set(by_name) - set(wanted) - set(extra_allowed)):
        problems.append(f"{label}: {name} is here but not in the contract")
    return problems


def check_clients(functions):
    """Each client's grant check (what it checks at its first call, and what only an option
    makes it check) and its README's grants against the contract's."""
    problems = []
    wanted = CONTRACT["client_grants"]
    checked, documented = contract.clients(), contract.client_readmes()
    for package in sorted(set(wanted) | set(checked) | set(documented)):
        if package not in wanted or package not in checked or package not in documented:
            problems.append(f"{package}: not in the contract, its code and its README alike")
            continue
        always, optional = set(wanted[package]["always"]), set(wanted[package]["with"])
        code = checked[package]
        for name in sorted(always - code["always"]):
            problems.append(f"{package}: checks no grant on {name}, which the contract says it always needs")
        for name in sorted(code["always"] - always):
            problems.append(f"{package}: always checks a grant on {name}, which the contract does not say it always needs")
        for name in sorted(set(wanted[package]["checked_for_options"]) - code["with"]):
            problems.append(f"{package}: checks no grant on {name} for an option, which the contract says it checks")
        for name in sorted(code["with"] - set(wanted[package]["checked_for_options"])):
            problems.append(f"{package}: checks a grant on {name} for an option, which the contract does not list")
        for name in sorted(set(wanted[package]["checked_for_options"]) - optional):
            problems.append(f"{package}: the contract checks {name} for an option but does not list it among its grants")
        readme = documented[package]
        if readme["always"] != always or readme["with"] & functions != optional:
            problems.append(f"{package}: its README asks for {sorted(readme['always'])} and {sorted(readme['with'] & functions)}, "
                            f"the contract for {sorted(always)} and {sorted(optional)}")
        for name in sorted((always | optional) - functions):
            problems.append(f"{package}: {name} is no function of the contract")
    return problems


def check_errors():
    """src/error.rs and the edition's _raise against contract/errors.json."""
    errors = json.loads((ROOT / "contract" / "errors.json").read_text())
    kinds = {e["sql_only"]: {**e, "message": e.get("sql_only_message", e["message"])} for e in errors["errors"] if e["sql_only"]}
    kinds.update({e["sql_only"]: e for e in errors["sql_only_errors"]})
    return (same_errors("src/error.rs", {e["rust"]: e for e in errors["errors"]}, contract.rust_errors(), str)
            + same_errors("sql-only/api.sql", kinds, contract.edition_errors(), lambda kind: f"_raise {kind!r}"))


def same_errors(where, wanted, found, named):
    """`found` errors (by name) against the contract's `wanted`: each in both, alike."""
    problems = []
    for name in sorted(set(wanted) | set(found)):
        if name not in found or name not in wanted:
            side = "the contract" if name in wanted else where
            problems.append(f"errors: {named(name)} is only in {side}")
            continue
        for field in ("sqlstate", "message", "hint"):
            if found[name][field] != wanted[name][field]:
                problems.append(f"{where}: {named(name)}'s {field}: contract {wanted[name][field]!r}, found {found[name][field]!r}")
    return problems


SECONDS = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}


def documented_default(cell, unit):
    """A default as docs/operations.md writes it (`60s`, `on`, `1200000`, empty), in the
    setting's own unit."""
    text = re.sub(r"\(.*?\)", "", cell).replace("`", "").strip()
    if text in ("empty", ""):
        return ""
    if text in ("on", "off"):
        return "true" if text == "on" else "false"
    m = re.fullmatch(r"(-?[0-9]+)(ms|s|min|h|d)?", text)
    if not m:
        return text
    if m.group(2) and unit:
        return str(round(int(m.group(1)) * SECONDS[m.group(2)] / SECONDS[unit]))
    return m.group(1)


def check_settings():
    """Every setting of src/settings.rs in docs/operations.md's table, with its default and
    who may set it, and no other."""
    problems = []
    table = {}
    for line in (ROOT / "docs" / "operations.md").read_text().splitlines():
        m = re.match(r"\| `(rate_limiter\.\w+)` \| (.*?) \| (.*?) \|", line)
        if m:
            table[m.group(1)] = (m.group(2), m.group(3))
    found = contract.settings()
    for name in sorted(set(found) | set(table)):
        if name not in table or name not in found:
            where = "src/settings.rs" if name in found else "docs/operations.md"
            problems.append(f"settings: {name} is only in {where}")
            continue
        setting, (default, who) = found[name], table[name]
        if documented_default(default, setting["unit"]) != setting["default"]:
            problems.append(f"docs/operations.md: {name}'s default {default!r}, src/settings.rs {setting['default']!r}")
        if setting["context"] not in who:
            problems.append(f"docs/operations.md: {name} is set by {who!r}, src/settings.rs says {setting['context']}")
    return problems


def main():
    functions = {f["name"]: f for f in CONTRACT["functions"]}
    problems = check("the extension", contract.extension(), functions, FIELDS + ("security_definer",))
    edition = [f for f in contract.edition() if not f["name"].startswith("_") or f["name"] in functions]
    problems += check("the SQL-only edition", edition, {n: f for n, f in functions.items() if f["sql_only"]},
                      extra_allowed=CONTRACT["sql_only_only"], overrides=CONTRACT["sql_only_differs"])
    router = [f for f in contract.router() if not f["name"].startswith("_")]
    problems += check("the router", router, {n: f for n, f in functions.items() if f["router"] == "routed"},
                      extra_allowed=CONTRACT["router_only"])
    problems += check_clients(set(functions))
    problems += check_errors()
    problems += check_settings()
    api = (ROOT / "docs" / "api.md").read_text()
    for name in sorted(n for n in functions if not n.startswith("_")):
        if not re.search(rf"\b{name}\b", api):
            problems.append(f"docs/api.md: {name} is not documented")
    for line in contract.documented():
        if line["name"] not in functions:
            problems.append(f"docs/api.md: a signature of {line['name']}, which is no function of the contract")
            continue
        problems += [f"docs/api.md: {line['name']}: {d}" for d in differences(functions[line["name"]], line, ("args", "returns"))]
    for p in problems:
        print(p)
    print(f"{len(functions)} functions, their errors and the settings: {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
