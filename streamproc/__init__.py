"""streamproc: LLM batch requests through Apache Kafka, each ending in a result or an explained failure."""

__version__ = "0.1.0"
