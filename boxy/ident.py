"""Who this is: the version and the varlink interface name, written here and nowhere
else. A leaf (it imports nothing), so every module of boxy can import it without
importing the package itself, whose lazy library API imports them in turn."""

VERSION = "0.1.0"
INTERFACE = "dev.boxy.Manager"
# Where a user reads about boxy (varlink's GetInfo url, the unit's Documentation=):
# the manual page `make setup` installs; boxy has no public web page.
DOCUMENTATION = "man:boxyctl(1)"
