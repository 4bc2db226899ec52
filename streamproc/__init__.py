"""streamproc: LLM batch requests through Apache Kafka, each ending in a result or an explained failure.

The package map and the architecture are in ``docs/design.md``; comments cite its sections as "design §N".
"""

__version__ = "0.2.0.dev0"
