"""pytest plugin: limits' own storage, strategy and concurrency tests, from its sdist and
unchanged, on this package's ``rate-limiter+postgresql://`` and
``async+rate-limiter+postgresql://`` storages only.

Every parametrize mark of a storage (``uri, args, fixture``, or test_storage.py's ``uri, args,
expected_instance, fixture``) is replaced, before pytest expands it, by one param on our
storage of the same kind (sync or async): the Redis, Memcached and MongoDB params, and the
docker fixtures behind them, are never generated. A test that fails for a difference the
package documents is in EXPECTED with its reason, marked xfail: any other failure fails the run.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid

import pytest
from limits.storage import SCHEMES
from pytest_lazy_fixtures import lf

import rate_limiter_postgres  # noqa: F401 - registers the storage schemes

SYNC_URI = os.environ["LIMITS_SUITE_URI"]
ASYNC_URI = "async+" + SYNC_URI
STORAGE_ARGNAMES = {"uri, args, fixture", "uri, args, expected_instance, fixture"}
MARK = "rate_limiter_postgres"
OURS = "rate-limiter-postgresql"

PHASE = ("fixed windows start at a per-key phase (README: limits): a key's window may end sooner than a whole "
         "period after its first hit, so the test passes or fails with the key's phase")
COUNTS_REFUSED = "a refused hit takes nothing (README: limits), where limits' storages count it"
RESET = "reset (every key of every application at once) is refused (README: limits)"
NO_PREVIOUS = "get_sliding_window reports the weighted count as the current window's, with no previous window"
SLIDING_RESET = "a sliding window is whole again when its weighted count has slid out, not at the window's end"
CELLS = "a rolling window counts in cells: an entry is forgotten late (up to a cell), never early"
HUGE = ("a rolling window of 1,000,000 counts in cells of float8: 1 remaining after 999,999 may read as 0, "
        "as the hits' cells fall (not strict: a run whose hits share a cell passes)")
# "Class::test" (sync and async) -> why it fails on these storages, and whether it always does
# (strict: a pass fails the run too, so the list stays true).
EXPECTED = {
    **{f"TestConcreteStorages::{t}": (why, True) for t, why in
       [("test_incr_custom_amount", COUNTS_REFUSED), ("test_storage_reset", RESET)]},
    **{f"{c}::test_fixed_window": (PHASE, False) for c in
       ["TestFixedWindow", "TestAsyncFixedWindow", "TestConcurrency", "TestAsyncConcurrency"]},
    **{f"{c}::test_sliding_window_counter_previous_window": (NO_PREVIOUS, True) for c in
       ["TestSlidingWindow", "TestAsyncSlidingWindow"]},
    "TestAsyncSlidingWindow::test_sliding_window_counter_stats": (NO_PREVIOUS, True),
    **{f"{c}::test_sliding_window_counter": (SLIDING_RESET, False) for c in ["TestSlidingWindow", "TestAsyncSlidingWindow"]},
    **{f"{c}::test_moving_window_stats": (CELLS, True) for c in ["TestMovingWindow", "TestAsyncMovingWindow"]},
    **{f"{c}::test_moving_window_multiple_cost": (CELLS, False) for c in ["TestMovingWindow", "TestAsyncMovingWindow"]},
    **{f"{c}::test_moving_window_huge_cost": (HUGE, False) for c in ["TestMovingWindow", "TestAsyncMovingWindow"]},
}


def pytest_configure(config):
    config.addinivalue_line("markers", f"{MARK}: limits' own tests on this package's storages")


def _ours(argnames: str, is_async: bool):
    uri = ASYNC_URI if is_async else SYNC_URI
    values = [uri, {}]
    if "expected_instance" in argnames:
        values.append(SCHEMES[urllib.parse.urlparse(uri).scheme])
    values.append(lf("rate_limiter_postgres_fresh"))
    return pytest.param(*values, marks=getattr(pytest.mark, MARK), id=("async-" if is_async else "") + OURS)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    """Before pytest's own hook expands the marks: a class's mark is shared by its tests, so a
    mark already replaced is left alone."""
    for node in metafunc.definition.listchain():
        for i, mark in enumerate(node.own_markers):
            if mark.name != "parametrize" or not mark.args or mark.args[0] not in STORAGE_ARGNAMES:
                continue
            params = list(mark.args[1])
            if any(OURS in str(getattr(p, "id", "")) for p in params):
                continue
            is_async = any(str(p.values[0]).startswith("async+") for p in params if hasattr(p, "values"))
            node.own_markers[i] = pytest.mark.parametrize(mark.args[0], [_ours(mark.args[0], is_async)]).mark


def pytest_collection_modifyitems(items):
    for item in items:
        cls = getattr(item, "cls", None)
        expected = EXPECTED.get(f"{cls.__name__ if cls else ''}::{getattr(item, 'originalname', item.name)}")
        if expected is not None and OURS in item.name:
            item.add_marker(pytest.mark.xfail(reason=expected[0], strict=expected[1]))


@pytest.fixture
def rate_limiter_postgres_fresh(request):
    """Each test (and each flaky rerun) counts under a limit name of its own: the suite reuses
    keys such as LIMITER/10/2/second in every test, as on an emptied Redis."""
    request.node.callspec.params["args"]["name"] = "suite_" + uuid.uuid4().hex[:12]
    yield
