import sys

from sqlrl.cli import main

sys.exit(main())
