"""What several tests share: servers (a mirror, an S3 store), clusters (Ray's multi-node test
cluster, the network-namespace hosts), stage folders, tiny models and configs, training
callbacks. Imported as ``helpers.<module>``: pytest puts ``tests/`` on ``sys.path`` (the
rootdir conftest), and a test module never imports another test module."""
