"""The guards' state machines, pure, with time passed in: buckets and rate limits, token estimates, AIMD,
circuit breakers, the retry budget and fallback routing. :mod:`streamproc.llm.guarded` wires them around
the LLM client and does the waiting."""
