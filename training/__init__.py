"""training: the Transformer's training (paper section 5): the shards' data and batch stream
(``data``), the ``Trainer`` (``trainer``), and what Ray Train runs on every worker (``worker``)."""
