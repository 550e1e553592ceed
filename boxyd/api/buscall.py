"""Calls of the bus itself (org.freedesktop.DBus), for the adapter and the notifier."""

from __future__ import annotations

from dbus_fast import Message


def to_the_bus(member: str, name: str) -> Message:
    """A call of org.freedesktop.DBus's MEMBER with one string: a bus name, or a
    match rule (AddMatch)."""
    return Message(
        destination="org.freedesktop.DBus",
        path="/org/freedesktop/DBus",
        interface="org.freedesktop.DBus",
        member=member,
        signature="s",
        body=[name],
    )
