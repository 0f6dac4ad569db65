"""The Node package in clients/node, built to its artifact (`npm pack`), installed from it into
a clean node_modules beside the libraries it plugs into (express-rate-limit, @fastify/rate-limit,
rate-limiter-flexible, at the versions clients/node/test/package.json pins), and its tests run
there with `node --test` against the test cluster."""

import json
import os
import shutil
import subprocess
from pathlib import Path

from clusters import VERSIONS, Cluster

PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "node"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "node"


def run(*cmd, cwd, env=None):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_node_package_from_its_artifact_through_the_libraries_it_plugs_into(tmp_path):
    run("npm", "ci", "--no-audit", "--no-fund", cwd=PACKAGE)
    run("npm", "run", "build", cwd=PACKAGE)
    # TypeScript users' code against the declarations: the limiter inside the library's wrappers.
    run("npm", "run", "typecheck", cwd=PACKAGE)
    tarball = run("npm", "pack", "--pack-destination", str(tmp_path), cwd=PACKAGE).strip().splitlines()[-1]
    app = tmp_path / "app"
    shutil.copytree(PACKAGE / "test", app / "test")
    manifest = json.loads((PACKAGE / "test" / "package.json").read_text())
    manifest["dependencies"]["rate-limiter-postgres"] = f"file:{tmp_path / tarball}"
    (app / "package.json").write_text(json.dumps(manifest))
    (app / "test" / "package.json").unlink()
    run("npm", "install", "--no-audit", "--no-fund", "--no-package-lock", cwd=app)
    installed = app / "node_modules" / "rate-limiter-postgres"
    assert not installed.is_symlink() and (installed / "dist" / "cjs" / "index.js").exists(), "installed from the tarball"
    env = {**os.environ, "PGDATABASE": os.environ.get("PGDATABASE", "rate_limiter_test")}
    out = run("node", "--test", "--test-reporter=spec", "test/", cwd=app, env=env)
    assert "# fail 0" in out or " fail 0" in out, out
    # The client's own calls on every other version's server too: the SQL it sends (among it
    # creditBefore's, which asks a limit's kind and takes a late credit back) is each
    # version's to answer.
    for version in VERSIONS:
        if version != "15":
            port = str(Cluster.of_test_command(version).port)
            out = run("node", "--test", "--test-reporter=spec", "test/client.test.mjs", cwd=app, env={**env, "PGPORT": port})
            assert "# fail 0" in out or " fail 0" in out, f"{version}: {out}"
    # The example that calls the package, as examples/README.md shows it.
    shutil.copy(EXAMPLES / "express_store.js", app / "express_store.js")
    assert run("node", "express_store.js", cwd=app, env=env).splitlines() == [
        "1. express-rate-limit: 200 200 429", "2. in the transaction: 500 200 429",
        "3. a plan changed mid-window: 200 200 429 | 200 200 200 429"]
