"""Guards that protect the provider and the budget (DESIGN §5, issue 6): pure logic, time passed in.

``bucket`` and ``ratelimit`` pace calls under the requests/min and tokens/min limits, ``tokens`` estimates
what a call costs against them, ``aimd`` adapts the in-flight limit to 429s and latency, ``breaker`` stops
calls to an endpoint that is down, and ``budget`` caps the retries of a batch. Nothing here does I/O or
sleeps: callers pass ``now`` (monotonic seconds) and act on the answers, so tests drive a fake clock.
"""
