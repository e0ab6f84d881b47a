"""The ``docker`` provider: containers as VMs (``vms``), the Engine API (``engine``), the offline image
(``image``) and the local instance-metadata endpoint (``metadata``)."""
