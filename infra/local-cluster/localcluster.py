#!/usr/bin/env python3
"""The local cluster's command line (the package ``cluster`` beside this file):

    sudo .venv/bin/python infra/local-cluster/localcluster.py up      # start it (about a minute)
    sudo .venv/bin/python infra/local-cluster/localcluster.py status  # hosts, addresses, services
    sudo .venv/bin/python infra/local-cluster/localcluster.py exec head -- \\
        tfm run configs/quickstart.yaml --set 'workdir=runs/local-cluster/work/{name}'
    sudo .venv/bin/python infra/local-cluster/localcluster.py down    # stop it, remove the network
"""

import sys

from cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
