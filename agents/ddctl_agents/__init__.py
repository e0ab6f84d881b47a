"""What runs in the regions: the learner and synchronizer agents, and the pure
algorithm core they share (``ddctl_agents.core``).

The folder is ``agents/`` but the import name is ``ddctl_agents``: a top-level
package called plain ``agents`` already belongs to a widely used SDK.
"""

__version__ = "0.1.0"
