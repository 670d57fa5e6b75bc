"""``python -m rcpflow`` is the `rcpflow` CLI."""

import sys

from rcpflow.cli import main

sys.exit(main())
