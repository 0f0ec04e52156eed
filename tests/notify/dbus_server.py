"""A minimal freedesktop notification server for tests, on the session bus it is started in.

Run inside ``dbus-run-session``. It owns ``org.freedesktop.Notifications``, advertises actions and
inline replies (as KDE's server does), prints every ``Notify`` and ``CloseNotification`` call as
one JSON line on stdout (after a first line ``{"address": ...}`` naming the bus), and on stdin
takes commands a person's click would cause: ``invoke ID ACTION_KEY`` (a button) or
``reply ID TEXT`` (the reply field).
"""

# ruff: noqa: F722, F821
# mypy: disable-error-code="name-defined, valid-type"
# (dbus-fast reads D-Bus signatures from string annotations)

import asyncio
import json
import os
import sys

from dbus_fast import Variant
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface, method, signal


class Notifications(ServiceInterface):
    def __init__(self) -> None:
        super().__init__("org.freedesktop.Notifications")
        self.next_id = 0

    @method()
    def GetCapabilities(self) -> "as":
        return ["actions", "body", "inline-reply", "persistence"]

    @method()
    def GetServerInformation(self) -> "ssss":
        return ["fleet-test-server", "fleet-tui", "1.0", "1.2"]

    @method()
    def Notify(
        self,
        app_name: "s",
        replaces_id: "u",
        app_icon: "s",
        summary: "s",
        body: "s",
        actions: "as",
        hints: "a{sv}",
        expire_timeout: "i",
    ) -> "u":
        self.next_id += 1
        record = {
            "id": self.next_id,
            "app_name": app_name,
            "summary": summary,
            "body": body,
            "actions": dict(zip(actions[1::2], actions[0::2], strict=False)),  # title -> key
            "hints": {k: v.value if isinstance(v, Variant) else v for k, v in hints.items()},
        }
        print(json.dumps(record, default=str), flush=True)
        return self.next_id

    @method()
    def CloseNotification(self, nid: "u") -> None:
        print(json.dumps({"closed": nid}), flush=True)
        self.NotificationClosed(nid, 3)

    @signal()
    def ActionInvoked(self, nid: "u", key: "s") -> "us":
        return [nid, key]

    @signal()
    def NotificationReplied(self, nid: "u", text: "s") -> "us":
        return [nid, text]

    @signal()
    def NotificationClosed(self, nid: "u", reason: "u") -> "uu":
        return [nid, reason]


async def main() -> None:
    bus = await MessageBus().connect()
    server = Notifications()
    bus.export("/org/freedesktop/Notifications", server)
    await bus.request_name("org.freedesktop.Notifications")
    print(json.dumps({"address": os.environ["DBUS_SESSION_BUS_ADDRESS"]}), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        cmd, nid, arg = [*line.rstrip("\n").split(" ", 2), "", ""][:3]
        if cmd == "invoke":
            server.ActionInvoked(int(nid), arg)
        elif cmd == "reply":
            server.NotificationReplied(int(nid), arg)
        print(json.dumps({"done": cmd}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
