"""Experiment tracking: every record of an MLflow run goes to its journal on disk and one
sender drains the journals to the server, so that a server that does not answer fails nothing.

``journal`` (a run's records, in order), ``delivery`` (one group of records as MLflow calls),
``sender`` (the background thread that drains the journals), ``session`` (what a command opens:
its sender; ``tfm tracking replay``), ``run`` (the Run API of stages), ``relay`` (what a
training rank writes through), ``owner`` (who owns a run; a killed process's runs end as
KILLED), ``copies`` (the journals in an object store's work dir), ``curve`` (a learning curve
from a journal). Below tasks and training, above corpora; plumbing to the code fingerprint.
"""
