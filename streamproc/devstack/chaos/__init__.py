"""Chaos runs: a batch through the local stack while workers die, the broker restarts, the LLM goes down and
poison records arrive; one table says whether anything was lost, duplicated or stalled.

One concept per module: ``config`` (the knobs), ``batch`` (the measured batch), ``poison`` (the hostile
records), ``fault_schedule``, ``proxy`` (deep-JSON answers in front of the mock), ``chaos_stack`` (the
processes), ``worker_metrics`` and ``facts`` (what is read back), ``tally`` (the pure verdict), ``chaos_run``
(the orchestration) and ``chaos_command``. Nothing is imported here: ``streamproc --help`` must not pay for the run.
"""
