"""Several client sessions at once: the concurrency tests' threads, started together."""

import threading


def in_sessions(count, body):
    """Runs body(0) .. body(count - 1) in threads released together; their results in order.
    A failure in any is raised again here, in the test's own thread, once all have ended."""
    results, failures = [None] * count, []
    start = threading.Barrier(count)

    def run(i):
        try:
            start.wait()
            results[i] = body(i)
        except Exception as e:  # noqa: BLE001 - raised again below
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise AssertionError(f"{len(failures)} of {count} sessions failed: {failures}") from failures[0]
    return results


def in_background(body):
    """Starts body() in a thread of its own and returns at once: the thread, and a list that
    gets body's result, or the exception it raised, for the test to assert on."""
    outcome = []

    def run():
        try:
            outcome.append(body())
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome
