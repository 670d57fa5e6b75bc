"""``python -m tpu_jobs.tunix_evaluate``: evaluate a Tunix checkpoint (see `tpu_jobs.tunix`)."""

import sys

from tpu_jobs.tunix.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
