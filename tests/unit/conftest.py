"""The unit tests call the walk, the guard and the scrubbers in their own process:
a process apart from boxyd, so the parsers of payload bytes may run in it
(boxyd/plan/payloadparse.py refuses that in boxyd; tests/unit/test_parseproc.py
checks both)."""

from boxyd.plan import payloadparse

payloadparse.allow_local()
