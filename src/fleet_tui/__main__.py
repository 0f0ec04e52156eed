"""`python -m fleet_tui` runs the command line."""

import sys

from fleet_tui.cli import main

sys.exit(main())
