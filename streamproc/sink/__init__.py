"""``streamproc sink``: results, failure attempts and dead letters into a database, idempotently (design §6).

Pure parts: the database URL (``target``), events -> rows (``rows``), the schema and its migrations
(``schema``). I/O: the connection and its transactions (``database``), the consumer that commits offsets only
after the rows are committed (``follow``).
"""
