"""The built-in local stack: a real Kafka broker from Maven jars, and the stack ``streamproc run`` starts."""
