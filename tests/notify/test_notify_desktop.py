"""Desktop notifications over a real D-Bus session bus, answered by clicking them.

``dbus-run-session`` starts a private session bus with the test's notification server on it
(dbus_server.py: records every Notify call, and clicks a button or fills the reply field on
command). The engine runs as the real ``fleet-tui run`` with that bus in its environment, as in a
desktop session; a question's choices arrive as buttons, the click answers the question, the
agent goes on with the answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.notify.receiver import need_program

from fleet_tui.scheduler.store.opener import open_store
from helpers import by_name, fleet, fleet_bg, fleet_env, quiet_home, wait_for

pytestmark = pytest.mark.timeout(180)


class Server:
    def __init__(self) -> None:
        need_program("dbus-run-session", "dbus")
        self.proc = subprocess.Popen(
            ["dbus-run-session", "--", sys.executable, str(Path(__file__).with_name("dbus_server.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        first = wait_for(lambda: self.lines, 30, 0.05, "the notification server on its bus")
        self.address = str(first[0]["address"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def notifications(self) -> list[dict[str, Any]]:
        return [x for x in self.lines if "summary" in x]

    def command(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def test_a_question_is_answered_from_the_desktop_notification(tmp_path: Path) -> None:
    server = Server()
    home = tmp_path / "home"
    quiet_home(home)
    with (home / "config.toml").open("a") as fh:
        fh.write('notify_desktop = "on"\nnotify_terminal = "off"\n')
    env = fleet_env(home, DBUS_SESSION_BUS_ADDRESS=server.address)
    prompt = '@sim ask="Which license?" options=MIT,Apache\n@sim ask="Name the release?"\n@sim ask="Ship it?"'
    fleet(home, "add", prompt, "--coder", "sim", "--name", "desk", "--cwd", str(tmp_path), env=env)
    run = fleet_bg(home, "run", "--until-idle", env=env, log=tmp_path / "run.log")
    try:
        first = wait_for(lambda: server.notifications(), 90, 0.1, "the question's notification")[0]
        assert first["summary"] == "fleet-tui: desk asks"
        assert "Which license? [MIT | Apache]" in first["body"]
        assert first["app_name"] == "fleet-tui"
        assert {"MIT", "Apache", "Answer"} <= set(first["actions"])  # the choices and the reply field
        server.command(f"invoke {first['id']} {first['actions']['Apache']}")  # a click on "Apache"

        def second() -> dict[str, Any] | None:
            rest = [n for n in server.notifications() if "Name the release?" in n["body"]]
            return rest[0] if rest else None

        note = wait_for(second, 90, 0.1, "the second question's notification")
        assert "MIT" not in note["actions"] and "Answer" in note["actions"]  # no choices: a reply field
        server.command(f"reply {note['id']} Aurora")

        def third() -> dict[str, Any] | None:
            rest = [n for n in server.notifications() if "Ship it?" in n["body"]]
            return rest[0] if rest else None

        ship = wait_for(third, 90, 0.1, "the third question's notification")
        (q,) = json.loads(fleet(home, "questions", "--json", env=env).stdout)
        fleet(home, "answer", q["id"], "yes", env=env)  # answered at a shell: the pop-up goes away
        wait_for(
            lambda: {"closed": ship["id"]} in server.lines, 30, 0.1, "the answered question's pop-up closed"
        )
        assert run.wait(120) == 0, (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        server.close()
    task = by_name(home)["desk"]
    assert task["status"] == "done", task
    logs = [json.loads(x) for x in fleet(home, "logs", "desk", "--json").stdout.splitlines()]
    answers = [e.get("text") or "" for e in logs if e["kind"] == "tool_result"]
    assert any("Apache" in a for a in answers) and any("Aurora" in a for a in answers), answers
    store = open_store(None, str(home))
    try:
        qs = store.questions(task["id"])
    finally:
        store.close()
    assert [(q.answer, q.answered_by) for q in qs][:2] == [("Apache", "desktop"), ("Aurora", "desktop")]
    assert qs[2].answer == "yes" and qs[2].answered_by != "desktop"
