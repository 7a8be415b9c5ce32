"""`python -m opsboard_agent.sim`: the cluster simulator."""

import sys

from opsboard_agent.sim.cli import main

sys.exit(main())
