import sys

from ddctl_agents.service.server import main

sys.exit(main())
