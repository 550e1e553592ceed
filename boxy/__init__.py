"""What boxyctl, boxyd and stage 2 share: errors, typed values, paths, the build id,
the varlink wire and the request and outcome of a run. Standard library only, and
nothing here imports boxyd or boxyctl: this is also the Python library (`import boxy`).

The version and the varlink interface name are written here and nowhere else.
"""

VERSION = "0.1.0"
INTERFACE = "dev.boxy.Manager"
