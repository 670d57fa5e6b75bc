"""``python -m tpu_jobs.evaluate``: evaluate a toy checkpoint (`tpu_jobs.toy.evaluate`)."""

import sys

from tpu_jobs.toy.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
