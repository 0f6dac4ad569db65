"""The Python package in clients/python, built to its wheel, installed from it into a fresh
virtualenv beside the libraries it plugs into (Flask-Limiter, SlowAPI, limits, the drivers,
SQLAlchemy, Django, at the versions clients/python/tests/requirements.txt pins), and its
tests run there against the test cluster."""

import os
import shutil
import subprocess
import sys
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
        "1. Flask-Limiter: 200 200 429", "2. in the transaction: 500 200 429"]
