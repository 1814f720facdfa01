"""The entry point of one rank started by :func:`tigon.workflows.compare_dist.launch` (``torch.distributed.run -m
tigon.workflows._nproc_rank ...``): :func:`tigon.workflows.compare_dist.rank_main`. A module of its own, which no
package ``__init__`` imports, so that ``python -m`` runs it fresh."""

import sys

from tigon.workflows.compare_dist import rank_main

if __name__ == "__main__":
    sys.exit(rank_main())
