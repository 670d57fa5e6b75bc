"""Accelerator jobs: the RCP recording library (`rcp`), the toy trainer (`toy`), the evaluator
(`eval`), the Tunix trainer (`tunix`), and the entry points ``python -m tpu_jobs.<job>``."""

import os

# Before Orbax or etils is imported anywhere below: gcsfs (which they use for gs:// folders)
# otherwise probes each bucket over gRPC for a hierarchical namespace, which waits up to 60 s
# when no credentials exist (the emulator case).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
