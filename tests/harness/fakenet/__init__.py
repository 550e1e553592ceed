"""The servers of boxy's test internet (see tests/harness/topology.py).

plan: the names/addresses/ports table; dns, web, recorder: the servers; ca: the
test CA; events: the logs tests read; serve: the per-netns server process.
"""
