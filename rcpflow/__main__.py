"""``python -m rcpflow`` is the `rcpflow` CLI."""

import sys

from rcpflow.cli.commands import main

sys.exit(main())
