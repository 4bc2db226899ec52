"""How streamproc reaches Kafka: one connection value (address, TLS, SASL) and the only constructors of clients."""
