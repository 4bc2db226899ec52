"""The pure core: vocabulary, events, failure verdicts, retry policy, request state, acker, headers, topics,
batch status and lag arithmetic, and the guards' state machines.

Nothing here does I/O, sleeps or imports a third-party package (an import-linter contract and a test in a
bare virtualenv check it): time comes in as arguments, so every rule is unit-testable in microseconds.
"""
