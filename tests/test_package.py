"""The Debian package (scripts/package.sh, run by the test command before this tier): it
installs with dpkg into the machine's PostgreSQL 15 in place of what `cargo pgrx install`
put there, the extension works from it (also created at a released version and updated),
and `dpkg -r` removes every file it installed. What was there before is put back."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clusters import connect

PACKAGES = Path(__file__).resolve().parent.parent / "target" / "packages"


def package(name):
    found = sorted(PACKAGES.glob(f"{name}_*.deb"))
    assert found, f"no {name} package in {PACKAGES}: run scripts/package.sh"
    return found[-1]


def files_of(deb):
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True).stdout
    paths = [line.split()[-1].lstrip(".") for line in listing.splitlines()]
    return [p for p in paths if not p.endswith("/")]


def dpkg(*args):
    result = subprocess.run(["dpkg", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("name", ["postgresql-15-rate-limiter", "postgresql-15-rate-limiter-proxy"])
def test_the_package_installs_works_and_removes_every_file_it_installed(database, tmp_path, name):
    deb = package(name)
    files = files_of(deb)
    assert files, "the package is empty"
    # What `cargo pgrx install` (or scripts/lib.sh) put there is kept aside, and removed, as
    # a DBA would before installing the package.
    kept = tmp_path / "kept"
    for f in files:
        if os.path.exists(f):
            (kept / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(f, kept / f.lstrip("/"))
    try:
        dpkg("-i", str(deb))
        assert all(os.path.exists(f) for f in files)
        assert f"ii  {name}" in dpkg("-l", name)
        if name == "postgresql-15-rate-limiter":
            with connect(dbname=database) as c:
                c.execute("DROP EXTENSION rate_limiter")
                c.execute("CREATE EXTENSION rate_limiter")
                assert c.execute("SELECT ok FROM rate_limiter.rate_limit('pkg', 'k', config => "
                                 "'{\"kind\": \"token bucket\", \"rate\": 1, \"period\": 1000}')").fetchone() == (True,)
                # Every released version installs from the package and updates to the newest.
                for released in ("0.1.0", "0.2.0", "0.3.0"):
                    c.execute("DROP EXTENSION rate_limiter")
                    c.execute(f"CREATE EXTENSION rate_limiter VERSION '{released}'")
                    c.execute("ALTER EXTENSION rate_limiter UPDATE")
                    assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'"
                                     ).fetchone() == (deb.name.split("_")[1],)
        else:
            with connect(dbname=database) as c:
                c.execute("CREATE EXTENSION rate_limiter_proxy CASCADE")
                assert c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter_proxy'::regnamespace"
                                 ).fetchone()[0] > 10
                c.execute("DROP EXTENSION rate_limiter_proxy")
        dpkg("-r", name)
        left = [f for f in files if os.path.exists(f)]
        assert left == [], f"dpkg -r left {left}"
    finally:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True).stdout
        if "installed" in status.split():
            subprocess.run(["dpkg", "-r", name], capture_output=True)
        for f in files:
            saved = kept / f.lstrip("/")
            if saved.exists():
                Path(f).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(saved, f)
