import sys

from ddctl_agents.agent.run import main

sys.exit(main())
