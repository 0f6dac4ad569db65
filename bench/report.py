"""Turn bench/out/raw.tsv (written by bench/run.sh) into bench/results.md and bench/chart.png."""
import statistics
import sys
from collections import defaultdict

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

raw_path, out_dir, machine = sys.argv[1], sys.argv[2], sys.argv[3]
COMPETITORS = ["bare", "bare_answering", "plpgsql", "upsert", "rate_limiter", "redis"]
WORKLOADS = {
    "a": "(a) 100,000 keys",
    "b": "(b) one hot key, allowed",
    "c": "(c) exhausted key, denied",
    "d": "(d) in a transaction with 1 ms of work",
}

rounds = defaultdict(list)
inproc = defaultdict(dict)
storage = {}
memory = []
for line in open(raw_path):
    f = line.rstrip("\n").split("\t")
    if f[0] == "tps":
        rounds[(f[1], f[2], f[3])].append(float(f[4]))
    elif f[0] == "inproc":
        inproc[f[1]][f[2]] = float(f[3])
    elif f[0].startswith("storage"):
        storage[f[0]] = tuple(int(x) for x in f[2:5])
    elif f[0] == "memory":
        memory.append(tuple(int(x) for x in f[1:4]))


tps = {k: statistics.median(v) for k, v in rounds.items()}


def cell(values):
    """The median, and the range of the rounds in thousands."""
    return f"{statistics.median(values):,.0f} ({min(values) / 1e3:.1f}k–{max(values) / 1e3:.1f}k)"


def ratio(a, b):
    return a / b if b else float("nan")


out = []
w = out.append
w("# Benchmark results\n")
w(f"Written by `bash bench/run.sh` on {machine}. pgbench `-M prepared`, autocommit unless noted; ")
w("competitors take turns and each figure is the median of its rounds; ")
w("Redis through `redis-benchmark` with `EVALSHA` of `bench/redis_bucket.lua`. ")
w("Each competitor is the same token bucket (10/s, capacity 10; workload (b) uses a bucket large ")
w("enough that every call is allowed) on its own table of the same shape; see `bench/competitors.sql`.\n")
for commit in ["on", "off"]:
    redis_note = "Redis with `appendfsync always`" if commit == "on" else "Redis without persistence"
    w(f"\n## Calls per second, `synchronous_commit = {commit}` ({redis_note})\n")
    w("| workload | " + " | ".join(COMPETITORS) + " |")
    w("|---|" + "---:|" * len(COMPETITORS))
    for key, label in WORKLOADS.items():
        cells = [cell(rounds[(commit, key, c)]) if (commit, key, c) in tps else "n/a" for c in COMPETITORS]
        w(f"| {label} | " + " | ".join(cells) + " |")

w("\n## Targets\n")
w("| target | measured | met |")
w("|---|---:|:---:|")
targets = []
for commit in ["on", "off"]:
    rl = tps[(commit, "a", "rate_limiter")]
    targets.append((f"(a) sync {commit}: rate_limiter / bare >= 0.95", ratio(rl, tps[(commit, "a", "bare")]), 0.95))
    targets.append(
        (f"(a) sync {commit}: rate_limiter / bare_answering >= 0.95", ratio(rl, tps[(commit, "a", "bare_answering")]), 0.95)
    )
    targets.append((f"(a) sync {commit}: rate_limiter / plpgsql >= 1.3", ratio(rl, tps[(commit, "a", "plpgsql")]), 1.3))
    targets.append((f"(a) sync {commit}: rate_limiter / upsert >= 1.3", ratio(rl, tps[(commit, "a", "upsert")]), 1.3))
    need = 2.0 if commit == "on" else 1.2
    targets.append(
        (f"(c) sync {commit}: denied / allowed (a) >= {need}", ratio(tps[(commit, "c", "rate_limiter")], rl), need)
    )
per_call = inproc  # seconds for 1,000,000 calls = microseconds per call
for p in ["insert", "update"]:
    targets.append(
        (f"in-process, {p} pass: rate_limiter / plpgsql <= 0.5",
         ratio(inproc["rate_limiter"][p], inproc["plpgsql"][p]), -0.5)
    )
total, _, rows = storage["storage"]
targets.append(("bytes per (name, key) row with index <= 120", total / rows, -120))
for label, value, bound in targets:
    met = value >= bound if bound > 0 else value <= -bound
    shown = f"{value:.2f}" if abs(bound) < 10 else f"{value:.1f}"
    w(f"| {label} | {shown} | {'yes' if met else '**no**'} |")

w("\n## In-process cost per call (1,000,000 calls in one statement, no network)\n")
w("`SELECT count(*) FROM generate_series(1, 1000000) g, LATERAL f('inproc', g::text)`; ")
w("the first pass inserts every row, the second updates them.\n")
w("| pass | rate_limiter µs/call | plpgsql µs/call | ratio |")
w("|---|---:|---:|---:|")
for p in ["insert", "update"]:
    a, b = per_call["rate_limiter"][p], per_call["plpgsql"][p]
    w(f"| {p} | {a:.2f} | {b:.2f} | {a / b:.2f} |")

w("\n## Storage (rate_limiter.state over 1,000,000 keys)\n")
w("| when | table + index bytes | heap bytes | rows | bytes per row |")
w("|---|---:|---:|---:|---:|")
for label, key in [("after 1,000,000 inserts", "storage"), ("after one update of every row, then VACUUM", "storage_after_update")]:
    t, h, n = storage[key]
    w(f"| {label} | {t:,} | {h:,} | {n:,} | {t / n:.0f} |")

w("\n## Backend memory over 1,000,000 calls in one session\n")
w("| calls | memory contexts (bytes) | private RSS (bytes) |")
w("|---:|---:|---:|")
for calls, contexts, rss in memory:
    w(f"| {calls:,} | {contexts:,} | {rss:,} |")
open(f"{out_dir}/results.md", "w").write("\n".join(out) + "\n")

SHORT = {"a": "(a) 100k keys", "b": "(b) hot key", "c": "(c) denied", "d": "(d) 1 ms txn"}
fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
colors = {"bare": "#999999", "bare_answering": "#cccccc", "plpgsql": "#4c72b0", "upsert": "#dd8452", "rate_limiter": "#55a868", "redis": "#c44e52"}
width = 0.14
for ax, commit in zip(axes, ["on", "off"]):
    for i, c in enumerate(COMPETITORS):
        xs = [j + (i - 2.5) * width for j, k in enumerate(WORKLOADS) if (commit, k, c) in tps]
        ys = [tps[(commit, k, c)] for k in WORKLOADS if (commit, k, c) in tps]
        ax.bar(xs, ys, width, label=c, color=colors[c])
    ax.set_xticks(range(len(WORKLOADS)), [SHORT[k] for k in WORKLOADS])
    ax.set_title(f"synchronous_commit = {commit}")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1000:.0f}k"))
    ax.grid(axis="y", alpha=0.3)
axes[0].set_ylabel("calls per second (median)")
axes[1].legend(loc="upper right", fontsize=8)
fig.suptitle("rate_limiter and the alternatives (higher is better)")
fig.tight_layout()
fig.savefig(f"{out_dir}/chart.png", dpi=110)
