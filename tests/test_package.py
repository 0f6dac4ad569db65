"""The Debian packages (scripts/package.sh, run by the test command before this tier): each
installs with dpkg into the machine's PostgreSQL 15 in place of what `cargo pgrx install`
put there, the extension works from it (also created at a released version and updated),
and `dpkg -r` removes every file it installed. What was there before is put back."""

import glob
import os
import subprocess
import tempfile

import pytest

from clusters import ROOT, VERSIONS, connect, pg_bin
from packages import dpkg, files_of, in_place_of_cargo_pgrx, package


@pytest.mark.parametrize("name", ["postgresql-15-rate-limiter", "postgresql-15-rate-limiter-proxy"])
def test_the_package_installs_works_and_removes_every_file_it_installed(database, tmp_path, name):
    with in_place_of_cargo_pgrx(name, tmp_path) as (deb, files):
        assert files, "the package is empty"
        dpkg("-i", str(deb))
        assert all(os.path.exists(f) for f in files)
        assert f"ii  {name}" in dpkg("-l", name)
        with connect(dbname=database) as c:
            if name == "postgresql-15-rate-limiter":
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
                c.execute("CREATE EXTENSION rate_limiter_proxy CASCADE")
                assert c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter_proxy'::regnamespace"
                                 ).fetchone()[0] > 10
                c.execute("DROP EXTENSION rate_limiter_proxy")
        dpkg("-r", name)
        left = [f for f in files if os.path.exists(f)]
        assert left == [], f"dpkg -r left {left}"


@pytest.mark.parametrize("major", VERSIONS)
def test_each_version_has_its_packages_in_debians_layout(major):
    """A package per supported major, laid out where Debian's and PGDG's postgresql-NN look
    (whatever prefix the build machine's NN has), with every install and upgrade script."""
    main, proxy = package(f"postgresql-{major}-rate-limiter"), package(f"postgresql-{major}-rate-limiter-proxy")
    library, extension = f"/usr/lib/postgresql/{major}/lib/rate_limiter.so", f"/usr/share/postgresql/{major}/extension"
    version = main.name.split("_")[1]
    scripts = {os.path.basename(p) for p in glob.glob(f"{ROOT}/sql/archive/rate_limiter--*.sql")
               + glob.glob(f"{ROOT}/sql/rate_limiter--*--*.sql")}
    scripts |= {"rate_limiter.control", f"rate_limiter--{version}.sql"}
    assert sorted(files_of(main)) == sorted([library] + [f"{extension}/{s}" for s in scripts])
    proxy_files = {os.path.basename(p) for p in glob.glob(f"{ROOT}/proxy/rate_limiter_proxy*")}
    assert sorted(files_of(proxy)) == sorted(f"{extension}/{s}" for s in proxy_files)
    assert field(main, "Depends") == f"postgresql-{major}"
    assert field(proxy, "Depends") == f"postgresql-{major}, postgresql-{major}-plproxy"
    # Its library is the one built for this major, which the tests load into its servers.
    installed = subprocess.run([f"{pg_bin(major)}/pg_config", "--pkglibdir"], check=True, capture_output=True,
                               text=True).stdout.strip() + "/rate_limiter.so"
    with open(installed, "rb") as f:
        assert library_of(main) == f.read(), f"the package's library is not the one installed into {major}"


def test_each_versions_package_has_its_own_library():
    libraries = {major: library_of(package(f"postgresql-{major}-rate-limiter")) for major in VERSIONS}
    assert len(set(libraries.values())) == len(VERSIONS), "each major's package has a library of its own"


def library_of(deb):
    """The bytes of the library in package `deb`."""
    with tempfile.TemporaryDirectory() as unpacked:
        subprocess.run(["dpkg-deb", "-x", str(deb), unpacked], check=True)
        (found,) = glob.glob(f"{unpacked}/usr/lib/postgresql/*/lib/rate_limiter.so")
        with open(found, "rb") as f:
            return f.read()


def field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], check=True, capture_output=True, text=True).stdout.strip()
