"""How the random tests draw. In the test command every one replays: Hypothesis derandomized
(its examples a function of the test alone, no example database) and every hand-rolled
generator seeded by `seeded(i)`. A deeper run, to look for new failures, is asked for:

    RATE_LIMITER_DEEP=20 RATE_LIMITER_SEED=7 bash scripts/test.sh 4

runs 20 times the examples, drawn at random (Hypothesis prints a failure's example and its
`@reproduce_failure` blob), and the hand-rolled generators from seed 7. A failure found so is
pinned in the repository with `@example` above the test, so that it runs every time after; what
a hand-rolled generator of concurrent sessions finds, as its interleaving (docs/testing.md)."""

import os
import random

from hypothesis import HealthCheck, settings

DEEP = int(os.environ.get("RATE_LIMITER_DEEP") or 0)
SEED = int(os.environ.get("RATE_LIMITER_SEED") or 0)


def drawn(examples):
    """The settings of a property test of `examples` examples."""
    return settings(max_examples=examples * DEEP if DEEP else examples, derandomize=not DEEP, database=None,
                    deadline=None, print_blob=bool(DEEP), suppress_health_check=list(HealthCheck))


def seeded(i):
    """The generator of a hand-rolled random test's i-th session or round: the same in every run
    of the test command, another in a deep run of another RATE_LIMITER_SEED."""
    return random.Random(i + 1_000_003 * SEED)


def examples_on(version, examples):
    """The examples of a property test on PostgreSQL `version`: all of them on 15, where tier 4
    runs whole, and a tenth on 16, 17 and 18, where the test runs for the write path that
    differs between versions; the rest of what the examples exercise (the bucket, the escrow,
    the checks of a config) is the same code on every version, drawn in full on 15."""
    return examples if version == "15" else max(examples // 10, 10)
