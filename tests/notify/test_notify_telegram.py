"""The two-way Telegram path against a fake Bot API on loopback (``telegram_api`` points at it,
as it would at a self-hosted Bot API server): questions go out with their choices as buttons, a
tap or a reply answers them, only the configured chat may answer, the first answer wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.notify.fake_telegram import FakeTelegram

from fleet_tui.scheduler.store.opener import open_store
from helpers import by_name, fleet, fleet_bg, quiet_home, wait_for

pytestmark = pytest.mark.timeout(180)

TOKEN = "123456:test-token"
CHAT = 4242


def questions(home: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(fleet(home, "questions", "--json").stdout)
    return rows


def sent(tg: FakeTelegram, needle: str) -> list[dict[str, Any]]:
    return [m for m in tg.sent if needle in m["text"]]


def tap(cid: str, chat: int, data: str, msg: dict[str, Any]) -> dict[str, Any]:
    """A callback_query update: someone in ``chat`` tapped a button of ``msg``."""
    user = {"id": 7, "username": "alice"} if chat == CHAT else {"id": 666, "username": "mallory"}
    return {
        "callback_query": {
            "id": cid,
            "from": user,
            "data": data,
            "message": {"message_id": msg["message_id"], "chat": {"id": chat}},
        }
    }


def test_questions_are_answered_from_the_telegram_chat(tmp_path: Path) -> None:
    tg = FakeTelegram(TOKEN)
    home = tmp_path / "home"
    quiet_home(home)
    with (home / "config.toml").open("a") as fh:
        fh.write(
            f'notify_desktop = "off"\ntelegram_token = "{TOKEN}"\ntelegram_chat = "{CHAT}"\n'
            f'telegram_api = "{tg.api}"\n'
        )
    prompt = '@sim ask="Which license?" options=MIT,Apache\n@sim ask="Name the release?"'
    fleet(home, "add", prompt, "--coder", "sim", "--name", "phone", "--cwd", str(tmp_path))
    run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
    try:
        wait_for(lambda: questions(home), 90, 0.2, "the first question")
        msg = wait_for(lambda: sent(tg, "phone asks"), 30, 0.1, "the bot's message")[0]
        assert msg["chat"]["id"] == CHAT and "Which license? [MIT | Apache]" in msg["text"]
        buttons = [b[0] for b in msg["reply_markup"]["inline_keyboard"]]
        assert [b["text"] for b in buttons] == ["MIT", "Apache"]
        tg.push(tap("cb-0", 666, buttons[0]["callback_data"], msg))  # a stranger's tap is ignored
        tg.push(tap("cb-1", CHAT, buttons[1]["callback_data"], msg))  # the person's tap answers
        wait_for(lambda: [a for a in tg.acks if a["callback_query_id"] == "cb-1"], 30, 0.1, "the tap's ack")
        assert not [a for a in tg.acks if a["callback_query_id"] == "cb-0"]
        assert "answered" in tg.acks[-1]["text"] and "Apache" in tg.acks[-1]["text"]
        tg.push(tap("cb-2", CHAT, buttons[0]["callback_data"], msg))  # too late: the first answer won
        wait_for(
            lambda: [a for a in tg.acks if a["callback_query_id"] == "cb-2"], 30, 0.1, "the late tap's ack"
        )
        assert "already answered" in tg.acks[-1]["text"] and "Apache" in tg.acks[-1]["text"]

        second = wait_for(lambda: sent(tg, "Name the release?"), 60, 0.1, "the second question")[0]
        assert "reply_markup" not in second  # no choices: answer by replying
        reply = {
            "message_id": 900,
            "from": {"id": 7, "username": "alice"},
            "chat": {"id": CHAT},
            "text": "Aurora",
            "reply_to_message": {"message_id": second["message_id"], "text": second["text"]},
        }
        tg.push({"message": reply})
        assert run.wait(120) == 0, (tmp_path / "run.log").read_text()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        tg.close()
    assert by_name(home)["phone"]["status"] == "done"
    store = open_store(None, str(home))
    try:
        qs = store.questions(by_name(home)["phone"]["id"])
    finally:
        store.close()
    assert [(q.answer, q.answered_by) for q in qs] == [
        ("Apache", "telegram:alice"),
        ("Aurora", "telegram:alice"),
    ]
