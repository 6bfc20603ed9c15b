"""`python -m sqlrl.cli`: the `sqlrl` command."""

import sys

from sqlrl.cli import main

sys.exit(main())
