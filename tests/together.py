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
