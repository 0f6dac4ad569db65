"""The project's Debian packages (built by scripts/package.sh into target/packages) installed
with dpkg in place of what `cargo pgrx install` put there, and everything put back after."""

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

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


def installed(name):
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True).stdout
    return "installed" in status.split()


@contextlib.contextmanager
def in_place_of_cargo_pgrx(name, keep):
    """Moves the files package `name` would install into `keep` (as a DBA removes what a
    source install left), yields the package's path and files; then removes the package if
    it is still installed and puts the files back."""
    deb = package(name)
    files = files_of(deb)
    # Where each file really is: Debian's directories may be links to a server's
    # (debian_layout_served_by), which `dpkg -r` removes with the package.
    real = [os.path.realpath(f) for f in files]
    for f in real:
        if os.path.exists(f):
            (keep / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(f, keep / f.lstrip("/"))
    try:
        yield deb, files
    finally:
        if installed(name):
            subprocess.run(["dpkg", "-r", name], capture_output=True)
        for f in real:
            saved = keep / f.lstrip("/")
            if saved.exists():
                Path(f).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(saved, f)


@contextlib.contextmanager
def debian_layout_served_by(major, bin_dir):
    """Debian's directories of PostgreSQL `major` (its library and extension directories) as
    links to those of the server in `bin_dir`, where that server is not Debian's package (16,
    17 and 18 here: scripts/servers.sh); removed after, if `dpkg -r` has not removed them
    with the package (it does: to dpkg they are the package's directories). For Debian's
    own 15, nothing."""
    if bin_dir == f"/usr/lib/postgresql/{major}/bin":
        yield
        return

    def ask(option):
        return subprocess.run([f"{bin_dir}/pg_config", option], check=True, capture_output=True,
                              text=True).stdout.strip()

    links = {f"/usr/lib/postgresql/{major}/lib": ask("--pkglibdir"),
             f"/usr/share/postgresql/{major}/extension": ask("--sharedir") + "/extension"}
    made = []
    try:
        for debian, server in links.items():
            if os.path.islink(debian) and os.readlink(debian) == server:
                continue
            assert not os.path.lexists(debian), f"{debian} exists and is not the server in {bin_dir}"
            parent = Path(debian).parent
            while not parent.exists():  # the directories made, to remove after
                made.append(parent)
                parent = parent.parent
            Path(debian).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(server, debian)
            made.insert(0, Path(debian))
        yield
    finally:
        for path in made:  # the link first, then the directories made for it, deepest first
            if path.is_symlink():
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
