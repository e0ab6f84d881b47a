import sys

from ddctl_agents.relay.serve import main

sys.exit(main())
