"""bench/app.md and bench/app.png from the load generator's runs.tsv and cdf.tsv.

Usage: report.py OUT_DIR BENCH_DIR "machine and settings line"
"""
import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out, bench, machine = sys.argv[1:4]
LIMITS = {
    "none": "no limit",
    "per_user": "rate_limiter, per user (100,000 keys)",
    "memory": "rate_limiter memory limit, per user (durable => false)",
    "hot": "rate_limiter, one hot key",
    "sharded": "rate_limiter, one key, 16 shards",
    "redis_always": "Redis before it, appendfsync always",
    "redis_everysec": "Redis before it, appendfsync everysec",
}
FORMS = {"statements": "statements", "one_trip": "one round trip"}

WORKS = {"read": "The read: the user's row by primary key", "write": "The write: insert a message"}

runs = list(csv.DictReader(open(f"{out}/runs.tsv"), delimiter="\t"))
by = defaultdict(list)
for r in runs:
    by[(r["work"], int(r["clients"]), r["limit"], r["form"])].append(r)
clients = sorted({k[1] for k in by})


def median(rows, column):
    return statistics.median(float(r[column]) for r in rows)


def rps_cell(rows):
    v = [float(r["rps"]) for r in rows]
    return f"{statistics.median(v):,.0f} ({min(v):,.0f}–{max(v):,.0f})"


def ms(us):
    return f"{us / 1000:.2f}"


lines = [
    "# The application's transaction with a limit",
    "",
    f"`bash bench/app/run.sh` ({machine}). Each request runs in its own transaction: the "
    "*read* selects the user's row by primary key (`app.users`, 100,000 users); the *write* "
    "inserts one message (`app.messages`: an identity primary key and an index on the user). "
    "*statements*: `BEGIN`, the limit, the work, `COMMIT`, a round trip each (as an ORM sends "
    "them); *one round trip*: one statement in autocommit (the limit joined with the "
    "`SELECT`, or `WITH l AS (SELECT ok FROM rate_limiter.rate_limit(...)) INSERT ... SELECT "
    "... FROM l WHERE l.ok`; for Redis, `EVALSHA` and then the work). Redis "
    "(bench/redis_bucket.lua) is called before the transaction on the user's key. The memory "
    "limit is the per-user limit with `durable => false`, snapshots on "
    "(`rate_limiter.memory_snapshot = 1s`). Requests per second, median of the rounds (range in "
    "brackets); latency percentiles in ms, medians of the rounds' percentiles.",
    "",
]
for work, title in WORKS.items():
    for c in clients:
        lines += [
            f"**{title}, {c} connections**",
            "",
            "| limit | form | requests/s | vs no limit | p50 | p99 | p99.9 |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for limit, label in LIMITS.items():
            for form, form_label in FORMS.items():
                rows = by.get((work, c, limit, form))
                if not rows:
                    continue
                base = median(by[(work, c, "none", form)], "rps")
                lines.append(
                    f"| {label} | {form_label} | {rps_cell(rows)} | {median(rows, 'rps') / base:.2f} | "
                    f"{ms(median(rows, 'p50_us'))} | {ms(median(rows, 'p99_us'))} | {ms(median(rows, 'p999_us'))} |"
                )
        lines.append("")

committed = sum(int(r["committed"]) for r in runs)
lines += [
    f"**Ledger.** After each of the {len(runs)} runs the generator compared three counts: "
    "the requests whose transaction committed, the messages in the table (none for the read), "
    "and the tokens the limit counts as used (rate_limiter's state rows and hot debit log, the "
    "memory limit's counts through `rate_limit_value`; Redis's buckets). "
    f"They were equal in every run ({committed:,} requests in all); the generator stops "
    "with an error when they are not. A request Redis admitted whose transaction then failed "
    "would show here as a token used with no message: Redis cannot take it back.",
    "",
    "![throughput and latency](app.png)",
    "",
]
open(f"{bench}/app.md", "w").write("\n".join(lines))

cdf = defaultdict(list)
for r in csv.DictReader(open(f"{out}/cdf.tsv"), delimiter="\t"):
    cdf[(r["work"], int(r["clients"]), r["limit"], r["form"])].append((float(r["percentile"]), float(r["latency_us"])))

fig, axes = plt.subplots(3, len(clients), figsize=(6.5 * len(clients), 13), squeeze=False)
SHORT = {"none": "no limit", "per_user": "per user", "memory": "memory", "hot": "hot key", "sharded": "16 shards",
         "redis_always": "Redis\nfsync always", "redis_everysec": "Redis\neverysec"}
colors = dict(zip(LIMITS, ["#555555", "#1f77b4", "#17becf", "#d62728", "#9467bd", "#ff7f0e", "#2ca02c"]))
for i, c in enumerate(clients):
    for row, work in enumerate(WORKS):
        ax = axes[row][i]
        width = 0.38
        for j, (form, form_label) in enumerate(FORMS.items()):
            xs, ys, cs = [], [], []
            for k, limit in enumerate(LIMITS):
                rows = by.get((work, c, limit, form))
                if rows:
                    xs.append(k + (j - 0.5) * width)
                    ys.append(median(rows, "rps"))
                    cs.append(colors[limit])
            ax.bar(xs, ys, width, color=cs, alpha=1.0 if j == 0 else 0.55, edgecolor="black", linewidth=0.4,
                   label=form_label)
        ax.set_xticks(range(len(LIMITS)))
        ax.set_xticklabels(SHORT.values(), fontsize=8)
        ax.set_ylabel("requests per second (median)")
        ax.set_title(f"the {work}, {c} connections: solid = statements, light = one round trip", fontsize=9)

    ax = axes[2][i]
    for limit, label in LIMITS.items():
        points = sorted(p for p in cdf.get(("write", c, limit, "statements"), []) if p[0] < 100)
        if points:
            ax.plot([1 / (1 - p / 100) for p, _ in points], [v / 1000 for _, v in points],
                    color=colors[limit], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 10, 100, 1000, 10000])
    ax.set_xticklabels(["0%", "50%", "90%", "99%", "99.9%", "99.99%"])
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency, ms")
    ax.set_title(f"the write, {c} connections, statements: latency by percentile (all rounds)", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if i == 0:
        ax.legend(fontsize=7)
fig.suptitle(f"The application's transaction with a limit ({machine})", fontsize=9)
fig.tight_layout()
fig.savefig(f"{bench}/app.png", dpi=110)
