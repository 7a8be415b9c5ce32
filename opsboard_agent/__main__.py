"""`python -m opsboard_agent ...` is the same as the `opsboard-agent` command."""

import sys

from opsboard_agent.cli import main

sys.exit(main())
