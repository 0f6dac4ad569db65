"""Throwaway PostgreSQL clusters for the operations tests: a subscriber, a standby, a cluster
to crash, one with the library preloaded. Each is owned by postgres (initdb refuses root),
listens only on a socket in /tmp, and is removed when its test ends."""

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = "/tmp/rate_limiter_clusters"
# The PostgreSQL majors the test command installed the extension into (scripts/test.sh).
VERSIONS = os.environ.get("RATE_LIMITER_PG_VERSIONS", "15").split()
# The test command's database on each version's cluster (PGDATABASE). Each pytest-xdist
# worker has one of its own (conftest's worker_database), so that no test sees another
# worker's limits, deny cache, statistics, grants or table locks.
DATABASE = os.environ.get("PGDATABASE", "rate_limiter_test")
if "PYTEST_XDIST_WORKER" in os.environ and not DATABASE.endswith(os.environ["PYTEST_XDIST_WORKER"]):
    DATABASE = f"{DATABASE}_{os.environ['PYTEST_XDIST_WORKER']}"
os.environ["PGDATABASE"] = DATABASE  # for every session and program a test starts


@functools.cache
def from_scripts(function, argument):
    """What a function of scripts/lib.sh prints for one argument: where each version lives is
    said once, there."""
    return subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/lib.sh" && {function} "$1"', "-", argument],
                          check=True, capture_output=True, text=True).stdout.strip()


@functools.cache
def from_lib(variable):
    """A variable of scripts/lib.sh (and of servers.sh, which it sources)."""
    return subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/lib.sh" && echo "${{{variable}}}"'],
                          check=True, capture_output=True, text=True).stdout.strip()


# The major the test command builds with assertions (scripts/servers.sh).
ASSERT_MAJOR = from_lib("ASSERT_MAJOR")
# A test of the extension's C paths (its shared memory, workers, transaction callbacks) runs on
# 15 and on the assert-enabled server by this parameter, as every_version runs on each.
on_assert_server = pytest.mark.parametrize("pg", [v for v in dict.fromkeys(["15", ASSERT_MAJOR]) if v in VERSIONS])


def pg_bin(version="15"):
    return from_scripts("pg_bin", version)


PG_BIN = pg_bin("15")

# A test of what differs between PostgreSQL versions (the write path, upgrades) runs on each
# by this parameter, which overrides conftest's `pg` fixture (15).
every_version = pytest.mark.parametrize("pg", VERSIONS)

# Every port a test cluster listens on (on a socket in /tmp only), in one place. The test
# command's own cluster is PGPORT (scripts/lib.sh). Each pytest-xdist worker (gw0, gw1, ...)
# has its own range, 200 ports above the previous worker's, so that workers never share one.
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
PORTS = {
    kind: [p + 200 * WORKER for p in port] if isinstance(port, list) else port + 200 * WORKER
    for kind, port in {
        "publisher": 5491, "subscriber": 5492, "primary": 5493, "standby": 5494, "crash": 5495,
        "worker": 5496, "cron": 5497, "stats": 5498, "stats_unloaded": 5499, "security": 5511, "in_place": 5512,
        "upgrade_old": 5513, "upgrade_new": 5514, "exporter": 5515, "hotkeys": 5516, "hot_crash": 5517,
        "hot_primary": 5518, "hot_standby": 5519, "hot_subscriber": 5520, "package": 5521, "hot_oracle": 5522,
        "slots_crash": 5523, "hot_updates": 5524, "memkeys": 5525, "sql_only": 5526, "planted": 5527, "discard": 5528, "partitions": [5620, 5621, 5622, 5623],
    }.items()
}


# The lines of a server log that tell of a fault: a failed assertion, a process ended by a
# signal (the postmaster's line for a crashed backend or worker), a PANIC. As
# scripts/lib.sh's SERVER_LOG_FAULTS, which judges the test command's own clusters.
SERVER_LOG_FAULTS = re.compile(r"^TRAP: | PANIC:  |\(PID [0-9]+\) was terminated by signal")


def connect(**kwargs):
    """A session on the test command's cluster (the PG* environment it sets), autocommit
    unless told otherwise; keyword arguments as psycopg.connect's (dbname, user, ...)."""
    kwargs.setdefault("autocommit", True)
    return psycopg.connect(**kwargs)


def as_postgres(*args, check=True):
    return subprocess.run(["sudo", "-u", "postgres", *args], check=check, capture_output=True, text=True)


class Cluster:
    def __init__(self, name, port, settings=(), version="15"):
        self.name, self.port, self.settings, self.version = name, port, list(settings), version
        self.bin = pg_bin(version)
        self.dir = f"{BASE}/{name}"

    @classmethod
    def of_test_command(cls, version="15"):
        """The cluster of `version` that the test command started (scripts/lib.sh), not to
        be destroyed."""
        cluster = cls("main", int(from_scripts("cluster_port", version)), version=version)
        cluster.dir = from_scripts("cluster_dir", version)
        return cluster

    def init(self, *options):
        self.remove()  # a directory an earlier run left, whose log is not this test's to judge
        os.makedirs(BASE, exist_ok=True)
        os.makedirs(self.dir)
        shutil.chown(BASE, "postgres")
        shutil.chown(self.dir, "postgres")
        # No fsync, as PostgreSQL's own tests run: a kill -9 loses nothing the kernel holds,
        # and no test cuts the machine's power.
        as_postgres(f"{self.bin}/initdb", "--no-sync", "-D", self.dir, "-A", "trust", "-U", "postgres", *options)
        return self

    def follow(self, primary):
        """This cluster made a physical standby of `primary` (its base backup, taken after a
        fast checkpoint, and the settings to stream from it), started."""
        os.makedirs(self.dir, exist_ok=True)
        shutil.chown(self.dir, "postgres")
        as_postgres(f"{self.bin}/pg_basebackup", "-h", "/tmp", "-p", str(primary.port), "-U", "postgres",
                    "-D", self.dir, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
        os.chmod(self.dir, 0o700)
        return self.start()

    def start(self):
        options = " ".join([f"-p {self.port}", "-k /tmp", "-c listen_addresses=''", "-c fsync=off", *self.settings])
        result = as_postgres(f"{self.bin}/pg_ctl", "-D", self.dir, "-l", f"{self.dir}/server.log", "-w", "start",
                             "-o", options, check=False)
        assert result.returncode == 0, f"{self.name} did not start: {result.stderr}\n{self.log()}"
        return self

    def stop(self, mode="fast"):
        as_postgres(f"{self.bin}/pg_ctl", "-D", self.dir, "-w", "-m", mode, "stop", check=False)
        self.judge()

    def judge(self):
        """Fails if the server's log tells of a crash or a failed assertion, whatever the test
        saw: a background worker's crash, or a backend's while no test's session was in it."""
        try:
            with open(f"{self.dir}/server.log", errors="replace") as f:
                faults = [line.rstrip() for line in f if SERVER_LOG_FAULTS.search(line)]
        except OSError:
            return
        assert not faults, f"{self.name}'s server log tells of a fault:\n" + "\n".join(faults[:20])

    def postmaster(self):
        """The postmaster's process id."""
        with open(f"{self.dir}/postmaster.pid") as f:
            return int(f.readline())

    def kill9(self):
        """Crash: SIGKILL the postmaster and every process it started, as a power cut would."""
        postmaster = self.postmaster()
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        for pid in [postmaster, *map(int, children)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in [postmaster, *map(int, children)]):
            assert time.time() < deadline, "killed processes did not go away"
            time.sleep(0.05)

    def destroy(self):
        try:
            if os.path.exists(f"{self.dir}/postmaster.pid"):
                self.stop("immediate")
            self.judge()
        finally:
            self.remove()

    def remove(self):
        if os.path.exists(f"{self.dir}/postmaster.pid"):
            as_postgres(f"{self.bin}/pg_ctl", "-D", self.dir, "-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self):
        try:
            with open(f"{self.dir}/server.log") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def connect(self, dbname="postgres", **kwargs):
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("user", "postgres")
        return psycopg.connect(host="/tmp", port=self.port, dbname=dbname, **kwargs)

    def conninfo(self, dbname="postgres"):
        return f"host=/tmp port={self.port} user=postgres dbname={dbname}"


def wait_for(predicate, what, timeout=60, interval=0.1, detail=lambda: ""):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what} {detail()}"
        time.sleep(interval)


def kill_9_under_load(cluster, script, *, clients, seconds, until, rate=None):
    """pgbench runs `script` (a pgbench file's text) on `cluster`'s postgres database with
    `clients` sessions (at `rate` transactions a second, if given) for up to `seconds`; once
    `until()` returns, the server is killed (SIGKILL, every process: a crash), the load ends
    with it, and the server starts again. The instant it was killed."""
    load_file = Path(tempfile.mkdtemp(prefix="load_")) / "load.sql"
    load_file.write_text(script)
    os.chmod(load_file.parent, 0o755)
    throttle = ["-R", str(rate)] if rate else []
    load = subprocess.Popen([f"{cluster.bin}/pgbench", "-h", "/tmp", "-p", str(cluster.port), "-U", "postgres", "-n",
                             "-c", str(clients), *throttle, "-T", str(seconds), "-f", str(load_file), "postgres"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until()
        killed_at = time.time()
        cluster.kill9()
        load.wait(30)
    finally:
        if load.poll() is None:
            load.kill()
        shutil.rmtree(load_file.parent, ignore_errors=True)
    cluster.start()
    return killed_at


def rows_reach(cluster, table, n, dbname="postgres"):
    """Waits until `table` on the cluster holds at least n rows: a load running there has
    committed that much."""
    with cluster.connect(dbname) as c:
        wait_for(lambda: c.execute(f"SELECT count(*) FROM {table}").fetchone()[0] >= n, f"{n} rows in {table}",
                 timeout=30, detail=cluster.log)
