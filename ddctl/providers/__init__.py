"""Where instances come from: clouds (next), Docker and local processes, behind one interface."""
