"""The Python package in clients/python, built to its wheel, installed from it into a fresh
virtualenv beside the libraries it plugs into (Flask-Limiter, SlowAPI, limits, the drivers,
SQLAlchemy, Django, at the versions clients/python/tests/requirements.txt pins), and its
tests run there against the test cluster."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "python"


def run(*cmd, cwd, env=None):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_python_package_from_its_wheel_through_the_libraries_it_plugs_into(tmp_path):
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path / "dist"), str(PACKAGE),
        cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("rate_limiter_postgres-*.whl"))
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run(*pip, "-r", str(PACKAGE / "tests" / "requirements.txt"), str(wheel), cwd=tmp_path)
    tests = tmp_path / "tests"
    shutil.copytree(PACKAGE / "tests", tests)
    env = {**os.environ, "PGDATABASE": os.environ.get("PGDATABASE", "rate_limiter_test")}
    out = run(str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests), cwd=tests, env=env)
    assert " passed" in out and "failed" not in out, out
    # The example that calls the package, as examples/README.md shows it.
    example = Path(__file__).resolve().parent.parent / "examples" / "python" / "flask_limiter_app.py"
    assert run(str(venv / "bin" / "python"), str(example), cwd=tmp_path, env=env).splitlines() == [
        "1. Flask-Limiter: 200 200 429", "2. in the transaction: 500 200 429",
        "3. a plan changed mid-window: 200 200 429 | 200 200 200 429"]
    run_limits_own_suite(tmp_path, venv, env)


LIMITS_SUITE_FILES = ["tests/test_storage.py", "tests/test_strategy.py", "tests/aio/test_storage.py",
                      "tests/aio/test_strategy.py", "tests/integration/test_concurrency.py"]


def extract_plain(archive, into):
    """extractall of an archive of plain files and folders inside `into`, refusing any other
    member: Debian 12's Python (3.11.2) has no extraction filter (filter="data" is 3.11.4)."""
    members = archive.getmembers()
    for member in members:
        inside = (into / member.name).resolve().is_relative_to(into.resolve())
        assert (member.isfile() or member.isdir()) and inside, f"unexpected member {member.name} in {archive.name}"
    archive.extractall(into, members=members)


def run_limits_own_suite(tmp_path, venv, env):
    """limits' own storage, strategy and concurrency tests, from its sdist (pinned by version and
    sha256), unchanged, on both storages of the package (tests/limits_suite/limits_suite_plugin.py):
    every test passes but those its EXPECTED list gives a documented reason for."""
    suite = PACKAGE / "tests" / "limits_suite"
    python = str(venv / "bin" / "python")
    run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(suite / "plugins.txt"), cwd=tmp_path)
    # Only limits as its sdist: --no-binary :all: would build its build requirements
    # (setuptools and the rest) from source too, three minutes of the run.
    run(python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-binary", "limits", "--no-deps",
        "--require-hashes", "-r", str(suite / "requirements.txt"), "-d", str(tmp_path / "sdist"), cwd=tmp_path)
    with tarfile.open(next((tmp_path / "sdist").glob("limits-*.tar.gz"))) as sdist:
        extract_plain(sdist, tmp_path / "limits")
    root = next((tmp_path / "limits").glob("limits-*"))
    uri = (f"rate-limiter+postgresql://{env.get('PGUSER', 'postgres')}@/{env['PGDATABASE']}"
           f"?host={env.get('PGHOST', '/tmp')}&port={env.get('PGPORT', '5432')}")
    # Their pytest.ini's options but for coverage and docker (-K); their conftest only starts
    # docker services. The pytest script, not python -m: the installed limits is tested.
    out = run(str(venv / "bin" / "pytest"), "--noconftest", "-p", "limits_suite_plugin", "-p", "no:cacheprovider",
              "-o", "addopts=", "-o", "asyncio_default_fixture_loop_scope=function", "-m", "rate_limiter_postgres",
              "-q", "-rfX", *LIMITS_SUITE_FILES, cwd=root,
              env={**env, "PYTHONPATH": f"{suite}:{root}", "LIMITS_SUITE_URI": uri})
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 35, out
