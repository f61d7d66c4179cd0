"""filesystem: where files live, as one seam below the libraries.

A place is a ``location.Location`` (a ``FileSystem``, a path in it and its name), opened one
way (``location.open_location``) from a local path or a URI; a work dir's root is a
``storage.Store`` (a local folder or an object store's prefix), whose folders a Ray worker is
handed as ``storage.StoredFolder`` and reads from this node's copy (``StoredFolder.local``); a
run's own folders are copied up and back by ``folder_sync``; credentials are masked out of URIs
by ``redact``. Only this package asks what kind of place a path names (its scheme): everything
above is handed the objects.
"""
