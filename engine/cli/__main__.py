"""`python -m engine.cli`: the `engine` command."""

import sys

from engine.cli import main

sys.exit(main())
