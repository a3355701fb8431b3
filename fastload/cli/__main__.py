"""``python -m fastload.cli``: the ``fastload`` command."""

import sys

from fastload.cli.command import main

sys.exit(main())
