"""Notifications reach a real HTTP service, once per event, without holding the engine up.

A JSON receiver on loopback (started by the test) stands in for ntfy/Slack/...: the config names
it with an apprise ``json://`` URL, exactly as a user would. Everything runs through the real
``fleet-tui`` command in subprocesses: ``add``, ``run --until-idle`` (one or two engines on one
store), ``questions``/``answer``, ``doctor``; synchronisation is by polling for conditions.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.notify.receiver import Receiver

from helpers import by_name, fleet, fleet_bg, quiet_home, wait_for

pytestmark = pytest.mark.timeout(180)

ASK_THEN_FAIL = '@sim ask="Which license header?" options=MIT,Apache\n@sim fail=cannot-continue'


def configure(home: Path, *lines: str) -> None:
    quiet_home(home)
    cfg = home / "config.toml"
    cfg.write_text(cfg.read_text() + 'notify_desktop = "off"\n' + "".join(line + "\n" for line in lines))


def questions(home: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(fleet(home, "questions", "--json").stdout)
    return rows


def finish(runs: list[subprocess.Popen[bytes]], log: Path) -> None:
    for run in runs:
        try:
            code = run.wait(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(10)
        assert code in (0, 3), log.read_text()  # 3: a task parked, a person is needed


def test_a_question_and_a_parked_task_each_post_once(tmp_path: Path) -> None:
    rx = Receiver()
    home = tmp_path / "home"
    configure(home, f'notify = ["{rx.url("fleet")}"]')
    try:
        fleet(home, "add", ASK_THEN_FAIL, "--coder", "sim", "--name", "asker", "--cwd", str(tmp_path),
              "--max-retries", "0")  # fmt: skip
        run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
        try:
            (q,) = wait_for(lambda: questions(home), 90, 0.2, "the question")
            (post,) = wait_for(lambda: rx.titled("asks"), 30, 0.1, "the question's POST")
            assert post["title"] == "asker asks"
            assert "Which license header?" in post["message"] and "[MIT | Apache]" in post["message"]
            assert f"fleet-tui answer {q['id']} MIT" in post["message"]  # what to type to act on it
            fleet(home, "answer", q["id"], "MIT")
        finally:
            finish([run], tmp_path / "run.log")
        assert by_name(home)["asker"]["status"] == "needs_human"
        (parked,) = wait_for(lambda: rx.titled("needs you"), 30, 0.1, "the needs_human POST")
        assert parked["title"] == "asker needs you"
        assert "retries_exhausted" in parked["message"] and "fleet-tui retry asker" in parked["message"]
        assert len(rx.titled("asks")) == 1 and rx.paths[0] == "/fleet"
        drained = rx.titled("drained")
        assert len(drained) == 1 and "1 need you" in drained[0]["message"]
        doctor = fleet(home, "doctor", check=False).stdout
        assert "notifications: 3 sent, 0 failed" in doctor, doctor
    finally:
        rx.close()


def test_two_engines_on_one_store_send_each_event_once(tmp_path: Path) -> None:
    rx = Receiver()
    home = tmp_path / "home"
    configure(home, f'notify = ["{rx.url()}"]')
    try:
        fleet(home, "add", ASK_THEN_FAIL, "--coder", "sim", "--name", "asker", "--cwd", str(tmp_path),
              "--max-retries", "0")  # fmt: skip
        log = tmp_path / "run.log"
        runs = [fleet_bg(home, "run", "--until-idle", log=log) for _ in range(2)]
        try:
            (q,) = wait_for(lambda: questions(home), 90, 0.2, "the question")
            wait_for(lambda: rx.titled("asks"), 30, 0.1, "the question's POST")
            fleet(home, "answer", q["id"], "Apache")
        finally:
            finish(runs, log)
        wait_for(lambda: rx.titled("needs you"), 30, 0.1, "the needs_human POST")
        assert len(rx.titled("asks")) == 1, rx.posts
        assert len(rx.titled("needs you")) == 1, rx.posts
        assert len(rx.titled("drained")) == 1, rx.posts
    finally:
        rx.close()


def test_a_receiver_that_never_answers_does_not_slow_the_engine(tmp_path: Path) -> None:
    rx = Receiver(hold=True)
    home = tmp_path / "home"
    configure(home, f'notify = ["{rx.url()}"]', "notify_timeout_s = 100", "max_concurrent = 2")
    try:
        fleet(home, "add", '@sim ask="Ship it?" options=yes,no', "--coder", "sim", "--name", "asker",
              "--cwd", str(tmp_path))  # fmt: skip
        fleet(home, "add", "@sim steps=12 pace=0.05", "--coder", "sim", "--name", "worker",
              "--cwd", str(tmp_path), "--priority", "-1")  # fmt: skip
        run = fleet_bg(home, "run", "--until-idle", log=tmp_path / "run.log")
        try:
            wait_for(lambda: rx.holding == 1, 90, 0.1, "the receiver holding the question's POST")
            # the notification is stuck in the receiver, yet the other agent's events flow to the end
            wait_for(lambda: by_name(home)["worker"]["status"] == "done", 90, 0.2, "worker done")
            assert rx.holding == 1
            logs = fleet(home, "logs", "worker", "--json").stdout.splitlines()
            assert sum(1 for line in logs if json.loads(line)["kind"] == "tool_call") == 12
            (q,) = questions(home)
            fleet(home, "answer", q["id"], "yes")
            wait_for(lambda: by_name(home)["asker"]["status"] == "done", 90, 0.2, "asker done")
        finally:
            rx.release()
            finish([run], tmp_path / "run.log")
    finally:
        rx.close()


def test_notify_test_reports_each_target(tmp_path: Path) -> None:
    import socket

    from tests.notify.fake_telegram import FakeTelegram

    rx = Receiver()
    tg = FakeTelegram("42:tok")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    home = tmp_path / "home"
    try:
        configure(home)
        none = fleet(home, "notify", "test", check=False)
        assert none.returncode == 1 and "no notification targets" in none.stderr
        with (home / "config.toml").open("a") as fh:
            fh.write(
                f'notify = ["{rx.url("ok")}", "json://127.0.0.1:{dead}/dead"]\nnotify_timeout_s = 5\n'
                f'telegram_token = "42:tok"\ntelegram_chat = "7"\ntelegram_api = "{tg.api}"\n'
            )
        out = fleet(home, "notify", "test", check=False)
        assert out.returncode == 1, out
        lines = out.stdout.splitlines()
        assert f"ok  json://127.0.0.1:{rx.port}/ok" in lines, lines
        assert "ok  telegram" in lines, lines
        assert any(x.startswith(f"--  json://127.0.0.1:{dead}/dead: ") for x in lines), lines
        assert [p["title"] for p in rx.posts] == ["fleet-tui test notification"]
        assert tg.sent[0]["chat"]["id"] == 7 and "fleet-tui test notification" in tg.sent[0]["text"]
    finally:
        rx.close()
        tg.close()


def test_failed_sends_are_counted_and_shown_by_doctor(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    home = tmp_path / "home"
    configure(home, f'notify = ["json://127.0.0.1:{dead}/gone"]', "notify_timeout_s = 3")
    fleet(home, "add", "@sim fail=x", "--coder", "sim", "--name", "parks", "--cwd", str(tmp_path),
          "--max-retries", "0")  # fmt: skip
    assert fleet(home, "run", "--until-idle", check=False).returncode == 3  # parked: needs a person
    assert by_name(home)["parks"]["status"] == "needs_human"
    doctor = fleet(home, "doctor", check=False).stdout
    line = next(x for x in doctor.splitlines() if "notifications:" in x)
    assert line.startswith("--  notifications: 0 sent, 2 failed  (json://"), line  # parked + drained
    assert f"last failure: json://127.0.0.1:{dead}/gone: " in line, line


def test_a_rate_limited_account_is_notified_and_so_is_its_end(tmp_path: Path) -> None:
    rx = Receiver()
    home = tmp_path / "home"
    configure(home, f'notify = ["{rx.url()}"]')
    try:
        fleet(home, "add", "@sim:1 rate-limit=3\n@sim:2+ steps=1", "--coder", "sim", "--name", "limited",
              "--cwd", str(tmp_path))  # fmt: skip
        run = fleet_bg(home, "run", log=tmp_path / "run.log")
        try:
            wait_for(lambda: by_name(home)["limited"]["status"] == "done", 120, 0.3, "the task done")
            wait_for(lambda: rx.titled("lifted"), 30, 0.1, "the lifted notice")
        finally:
            run.terminate()
            run.wait(60)
        titles = [p["title"] for p in rx.posts]
        assert [t for t in titles if "rate" in t] == ["sim rate-limited", "sim rate limit lifted"], titles
        (limited,) = rx.titled("rate-limited")
        assert "new starts on sim wait until" in limited["message"] and "fleet-tui plan" in limited["message"]
    finally:
        rx.close()
