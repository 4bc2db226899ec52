"""The worker: the faust app and its patches, the dispatcher and handler, metrics, and Kafka I/O helpers."""
