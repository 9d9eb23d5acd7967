"""`python -m scorekeeper_worker.hub_download`: the stable entry point of `model/hub_download.py`, which the
operator's init container runs (worker images of other versions keep it)."""

import sys

from scorekeeper_worker.model.hub_download import main

if __name__ == "__main__":
    sys.exit(main())
