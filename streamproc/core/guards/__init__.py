"""The guards' state machines, pure, with time passed in: buckets and rate limits, token estimates, the
gradient in-flight limit, per-model timeouts and pauses,
circuit breakers, the retry budget and fallback routing. The wrappers in :mod:`streamproc.llm` (stacked by
:mod:`streamproc.llm.guarded`) wire them around the LLM client and do the waiting; the retry budget is also
a stop condition of the retry decision (:func:`streamproc.core.retry_policy.within_budget`)."""
