"""``python -m tpu_jobs.train``: the toy GRPO training job (`tpu_jobs.toy.train`)."""

import sys

from tpu_jobs.toy.train import main

if __name__ == "__main__":
    sys.exit(main())
