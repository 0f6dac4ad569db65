"""Monitoring through Prometheus: Debian's postgres_exporter with monitoring/postgres_exporter.yml,
started on loopback against the test cluster (which preloads the library), scraped after known
calls; and the Grafana dashboard asks only for metrics the exporter gives."""

import json
import os
import re
import subprocess
import time
import urllib.request

from clusters import PORTS, ROOT, every_version

EXPORTER = "/usr/bin/prometheus-postgres-exporter"
SAMPLE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def samples(text):
    """(metric, labels, value) of every labelled sample."""
    found = []
    for line in text.splitlines():
        if match := SAMPLE.match(line):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2)))
            found.append((match.group(1), labels, float(match.group(3))))
    return found


@every_version
def test_the_exporter_exposes_each_limits_counters_and_top_denied_keys(test_cluster, database_name, name):
    with test_cluster.connect(database_name) as c:
        c.execute("SELECT rate_limiter.define(%s, 'token bucket', 2, '1 hour')", (name,))
        for _ in range(5):
            c.execute("SELECT rate_limiter.rate_limit(%s, 'mallory')", (name,))
        c.execute("SELECT rate_limiter.rate_limit(%s, 'alice', 3, reserve => true)", (name,))
        # A session in shadow mode: mallory's next two calls would be denied, and are let through.
        c.execute("SET rate_limiter.shadow = on")
        for _ in range(2):
            assert c.execute("SELECT ok, reason FROM rate_limiter.rate_limit(%s, 'mallory')", (name,)).fetchone() == (
                True, "shadow")
    port = PORTS["exporter"]
    env = dict(os.environ, DATA_SOURCE_NAME=f"host=/tmp port={test_cluster.port} user=postgres dbname={database_name} sslmode=disable")
    exporter = subprocess.Popen([EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                                 f"--extend.query-path={ROOT}/monitoring/postgres_exporter.yml",
                                 "--disable-default-metrics", "--disable-settings-metrics"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, ours = time.time() + 30, []
        while not ours:
            assert time.time() < deadline, "the exporter exposed no rate_limiter metrics"
            try:
                ours = [s for s in samples(scrape(port)) if s[1].get("name") == name]
            except OSError:
                time.sleep(0.2)
        value = {(metric, labels.get("key")): v for metric, labels, v in ours}
        assert all(labels["database"] == database_name for _, labels, _ in ours)
        # mallory: 2 allowed, 3 denied, 2 shadow-denied; alice: one reservation of 3 tokens,
        # ok, to wait.
        assert value[("rate_limiter_calls", None)] == 8
        assert value[("rate_limiter_allowed", None)] == 5
        assert value[("rate_limiter_denied", None)] == 3
        assert value[("rate_limiter_shadow_denied", None)] == 2
        assert value[("rate_limiter_memory_in_rows", None)] == 0
        assert value[("rate_limiter_tokens_granted", None)] == 2
        assert value[("rate_limiter_tokens_reserved", None)] == 3
        assert value[("rate_limiter_top_denied", "mallory")] == 3
        assert ("rate_limiter_top_denied", "alice") not in value

        # Every metric the dashboard asks for is one the exporter gives.
        with open(f"{ROOT}/monitoring/grafana-dashboard.json") as f:
            dashboard = json.load(f)
        exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
        asked = {m for e in exprs for m in re.findall(r"\brate_limiter_\w+", e)}
        given = {metric for metric, _, _ in ours}
        assert asked and asked <= given, asked - given
    finally:
        exporter.terminate()
        exporter.wait(10)
