"""What one process of an evaluation worker holds after the evaluator's restore, for
test_multihost_eval: started by `tpu_jobs.launch`, it joins the system, restores a checkpoint
as the toy evaluator does (`restore_sharded_params` over the mesh of all devices) and writes
``OUT_DIR/process_<i>.json``: per leaf its global shape, whether this process can address all of
it, and per addressable shard its index and the sha256 of its bytes. A file, not stdout: the
processes share one pipe, and a record longer than the pipe's atomic write (4 KiB) interleaved
with the other process's.

    python multihost_eval_driver.py STEP_PATH OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import jax
import numpy as np

from tpu_jobs.rcp import distributed, sharding
from tpu_jobs.rcp.checkpoint_restore import restore_sharded_params
from tpu_jobs.rcp.fingerprint import leaf_name


def main(step_path: str, out_dir: str) -> None:
    distributed.initialize(distributed.layout_from_env())
    params, meta = restore_sharded_params(step_path, None, sharding.mesh())
    leaves = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        leaves[leaf_name(path)] = {
            "shape": list(leaf.shape),
            "fully_addressable": leaf.is_fully_addressable,
            "shards": [
                {
                    "index": [[s.start, s.stop] for s in shard.index],
                    "sha256": hashlib.sha256(np.asarray(shard.data).tobytes()).hexdigest(),
                }
                for shard in leaf.addressable_shards
            ],
        }
    record = {"process": jax.process_index(), "step": meta.step, "leaves": leaves}
    Path(out_dir, f"process_{jax.process_index()}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
