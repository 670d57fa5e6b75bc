"""``python -m tpu_jobs.tunix_train``: the Tunix GRPO training job (`tpu_jobs.tunix.train`)."""

import sys

from tpu_jobs.tunix.train import main

if __name__ == "__main__":
    sys.exit(main())
