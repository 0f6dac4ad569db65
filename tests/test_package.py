"""The Debian packages (scripts/package.sh, run by the test command before this tier): each
major's installs with dpkg into the server of that major in place of what `cargo pgrx install`
put there, the extension works from it (also created at a released version and updated),
and `dpkg -r` removes every file it installed. What was there before is put back.

Only 15 is a Debian package on this machine; 16, 17 and 18 are servers in a cache
(scripts/servers.sh). For them, Debian's directories of that major are made links to the
server's own for the test, so that dpkg installs where that server looks, and dpkg is told
that postgresql-NN, which it does not know, is there."""

import glob
import os
import subprocess
import tempfile

import pytest

from clusters import PORTS, ROOT, VERSIONS, pg_bin
from packages import debian_layout_served_by, dpkg, files_of, in_place_of_cargo_pgrx, package

# dpkg moves the installed library aside and back: no other test may load it meanwhile.
pytestmark = pytest.mark.alone

RELEASED = ("0.1.0", "0.2.0", "0.3.0", "0.4.0")


@pytest.mark.parametrize("pg", VERSIONS)
@pytest.mark.parametrize("kind", ["rate-limiter", "rate-limiter-proxy"])
def test_the_package_installs_works_and_removes_every_file_it_installed(clusters, tmp_path, pg, kind):
    name = f"postgresql-{pg}-{kind}"
    with debian_layout_served_by(pg, pg_bin(pg)), in_place_of_cargo_pgrx(name, tmp_path) as (deb, files):
        assert files, "the package is empty"
        real = [os.path.realpath(f) for f in files]  # through the links, for 16 to 18
        dpkg("-i", *([] if pg == "15" else ["--force-depends"]), str(deb))
        assert all(os.path.exists(f) for f in files)
        assert f"ii  {name}" in dpkg("-l", name)
        # A server started after the install, preloading the library as production does: a
        # running one would keep the library it mapped before. No prune worker, as on the
        # test command's clusters, so the extension's DDL below never meets a round of it.
        server = clusters("package", PORTS["package"], ["-c shared_preload_libraries=rate_limiter",
                                                        "-c rate_limiter.prune_interval=0"]).init().start()
        with server.connect() as c:
            if kind == "rate-limiter":
                library = f"/usr/lib/postgresql/{pg}/lib/rate_limiter.so"
                assert mapped_inodes(server, "rate_limiter.so") == {os.stat(library).st_ino}, \
                    "the server runs the package's library"
                c.execute("CREATE EXTENSION rate_limiter")
                assert c.execute("SELECT ok FROM rate_limiter.rate_limit('pkg', 'k', config => "
                                 "'{\"kind\": \"token bucket\", \"rate\": 1, \"period\": 1000}')").fetchone() == (True,)
                # Every released version installs from the package and updates to the newest.
                for released in RELEASED:
                    c.execute("DROP EXTENSION rate_limiter")
                    c.execute(f"CREATE EXTENSION rate_limiter VERSION '{released}'")
                    c.execute("ALTER EXTENSION rate_limiter UPDATE")
                    assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'rate_limiter'"
                                     ).fetchone() == (deb.name.split("_")[1],)
            elif c.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'plproxy'").fetchone():
                c.execute("CREATE EXTENSION rate_limiter_proxy CASCADE")
                assert c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'rate_limiter_proxy'::regnamespace"
                                 ).fetchone()[0] > 10
                c.execute("DROP EXTENSION rate_limiter_proxy")
            else:
                # PL/Proxy is packaged for 15 only here (docs/scaling-out.md): the router's
                # files are where the server looks, which is as far as it can go.
                assert c.execute("SELECT default_version FROM pg_available_extensions "
                                 "WHERE name = 'rate_limiter_proxy'").fetchone() is not None
        server.destroy()
        dpkg("-r", name)
        left = [f for f in set(files + real) if os.path.exists(f)]
        assert left == [], f"dpkg -r left {left}"


def mapped_inodes(server, library):
    """The inodes of the files named `library` that the server's postmaster has mapped."""
    with open(f"{server.dir}/postmaster.pid") as f:
        postmaster = int(f.readline())
    with open(f"/proc/{postmaster}/maps") as maps:
        return {int(line.split()[4]) for line in maps if line.rstrip().endswith("/" + library)}


@pytest.mark.parametrize("major", VERSIONS)
def test_each_version_has_its_packages_in_debians_layout(major):
    """A package per supported major, laid out where Debian's and PGDG's postgresql-NN look
    (whatever prefix the build machine's NN has), with every install and upgrade script."""
    test_cluster, proxy = package(f"postgresql-{major}-rate-limiter"), package(f"postgresql-{major}-rate-limiter-proxy")
    library, extension = f"/usr/lib/postgresql/{major}/lib/rate_limiter.so", f"/usr/share/postgresql/{major}/extension"
    version = test_cluster.name.split("_")[1]
    scripts = {os.path.basename(p) for p in glob.glob(f"{ROOT}/sql/archive/rate_limiter--*.sql")
               + glob.glob(f"{ROOT}/sql/rate_limiter--*--*.sql")}
    scripts |= {"rate_limiter.control", f"rate_limiter--{version}.sql"}
    assert sorted(files_of(test_cluster)) == sorted([library] + [f"{extension}/{s}" for s in scripts])
    proxy_files = {os.path.basename(p) for p in glob.glob(f"{ROOT}/proxy/rate_limiter_proxy*")}
    assert sorted(files_of(proxy)) == sorted(f"{extension}/{s}" for s in proxy_files)
    assert field(test_cluster, "Depends") == f"postgresql-{major}"
    assert field(proxy, "Depends") == f"postgresql-{major}, postgresql-{major}-plproxy"
    # Its library is the one built for this major, which the tests load into its servers.
    installed = subprocess.run([f"{pg_bin(major)}/pg_config", "--pkglibdir"], check=True, capture_output=True,
                               text=True).stdout.strip() + "/rate_limiter.so"
    with open(installed, "rb") as f:
        assert library_of(test_cluster) == f.read(), f"the package's library is not the one installed into {major}"


@pytest.mark.parametrize("major", VERSIONS)
def test_each_package_has_debians_modes_whatever_the_builders_umask(major):
    """The test command builds the packages under umask 002; 0.4.0's then held 0775
    directories and 0664 scripts (group-writable, on every server that installs them)."""
    for deb in (package(f"postgresql-{major}-rate-limiter"), package(f"postgresql-{major}-rate-limiter-proxy")):
        # The files, then the control archive (its directory and the control file).
        listing = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True).stdout
        listing += subprocess.run(f"dpkg-deb --ctrl-tarfile '{deb}' | tar -tv", shell=True, check=True,
                                  capture_output=True, text=True).stdout
        for line in listing.splitlines():
            mode, owner, path = line.split()[0], line.split()[1], line.split()[-1]
            expected = ("drwxr-xr-x" if path.endswith("/") else
                        "-rwxr-xr-x" if path.endswith(".so") else "-rw-r--r--")
            assert (mode, owner) == (expected, "root/root"), f"{deb.name}: {line}"


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
