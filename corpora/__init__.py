"""corpora: parallel text in, Parquet shards out.

Where the corpora come from (``sources``: the WMT14 registry, dev and test sets from sacreBLEU's
own registry), getting them (``fetch``: resumable verified downloads; ``archives``: safe
streaming extraction), their text formats (``text``), the raw corpus folder the download stage
writes (``assemble``), normalisation and filters (``filters``) applied through Ray Data
(``cleaning``), subword models (``subwords``), Parquet files (``parquet``) and encoding into
token-id shards (``encoding``, in a Ray Data actor pool: ``actor_pools``), and the quickstart's
synthetic grammar (``synthetic``). Where files live is the ``filesystem`` package's, below.
"""


class CorpusError(RuntimeError):
    """Bad or missing corpus data, or a failed download; the message says which file and why."""
