"""Runtime config: strict loading with file:line, comment-preserving set, hot reload."""

from __future__ import annotations

import os
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest

from fleet_tui.config import (
    KEYS,
    Config,
    ConfigError,
    ConfigWatcher,
    config_path,
    default_text,
    get_value,
    load_config,
    parse_value,
    set_value,
    write_default,
)

pytestmark = pytest.mark.timeout(60)


def write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body).lstrip("\n"), encoding="utf-8")
    return path


def bump(path: Path, body: str) -> None:
    """Rewrite ``path`` and move its mtime on, so a poll sees it regardless of clock granularity."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    write(path, body)
    os.utime(path, ns=(before + 10_000_000, before + 10_000_000))


def test_defaults() -> None:
    c = Config()
    assert (c.max_concurrent, c.default_coder, c.default_model, c.max_retries) == (4, "claude", None, 2)
    assert c.rate_limit_threshold == 0.9 and c.max_load_per_core == 2.0
    assert c.max_line_bytes == 64 * 1024 * 1024
    assert c.retry_backoff_s == (30.0, 120.0, 480.0)
    assert c.on_quit == "ask" and c.store is None and c.host_tags == () and c.keep_worktrees is False
    assert set(KEYS) == {f.name for f in fields(Config)}


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path / "config.toml") == Config()
    assert config_path(tmp_path) == tmp_path / "config.toml"


def test_load_values_and_types(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config.toml",
        """
        max_concurrent = 8
        default_model = "opus"
        rate_limit_threshold = 0.8
        mem_floor_gib = 3          # ints are fine for float keys
        retry_backoff_s = [5, 10.5]
        host_tags = ["gpu", "docker"]
        keep_worktrees = true
        on_quit = "leave"
        store = "postgresql://x@y/z"
    """,
    )
    c = load_config(path)
    assert c.max_concurrent == 8 and c.default_model == "opus" and c.rate_limit_threshold == 0.8
    assert c.mem_floor_gib == 3.0 and isinstance(c.mem_floor_gib, float)
    assert c.retry_backoff_s == (5.0, 10.5) and c.host_tags == ("gpu", "docker")
    assert c.keep_worktrees is True and c.on_quit == "leave" and c.store == "postgresql://x@y/z"


def test_unknown_key_names_file_line_and_did_you_mean(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config.toml",
        """
        # comment
        max_concurrent = 2

        max_concurent = 3
    """,
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == f"{path}:4: unknown config key 'max_concurent' — did you mean 'max_concurrent'?"


def test_sections_are_unknown_keys_with_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "# mine\n[limits]\nmax_concurrent = 3\n")
    with pytest.raises(ConfigError, match=r":2: unknown config key 'limits'.*flat"):
        load_config(path)


def test_wrong_types_and_ranges_all_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config.toml",
        """
        max_concurrent = "four"
        rate_limit_threshold = 1.5
        keep_worktrees = "yes"
        on_quit = "stpo"
        retry_backoff_s = []
        max_retries = -1
        host_tags = "gpu"
        lease_s = 1.0
    """,
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    lines = str(exc.value).splitlines()
    assert lines == [
        f"{path}:1: max_concurrent must be a whole number, got 'four'",
        f"{path}:2: rate_limit_threshold must be at most 1, got 1.5",
        f"{path}:3: keep_worktrees must be true or false, got 'yes'",
        f"{path}:4: on_quit must be 'ask' or 'leave' or 'stop', got 'stpo' — did you mean 'stop'?",
        f"{path}:5: retry_backoff_s must be a non-empty array of numbers like [30, 120, 480], got []",
        f"{path}:6: max_retries must be at least 0, got -1",
        f'{path}:7: host_tags must be an array of strings like ["gpu", "docker"], got \'gpu\'',
    ]


def test_heartbeat_must_be_shorter_than_lease(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "lease_s = 10\nheartbeat_s = 10\n")
    with pytest.raises(ConfigError, match=r":2: heartbeat_s \(10\) must be less than lease_s \(10\)"):
        load_config(path)


def test_bad_toml(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "max_concurrent = = 3\n")
    with pytest.raises(ConfigError, match=r"bad TOML: .*line 1"):
        load_config(path)


def test_parse_value() -> None:
    assert parse_value("max_concurrent", "8") == 8
    assert parse_value("max_line_bytes", "1_048_576") == 1048576
    assert parse_value("stall_min", "2.5") == 2.5
    assert parse_value("stall_min", "3") == 3.0
    assert parse_value("keep_worktrees", "yes") is True
    assert parse_value("keep_worktrees", "off") is False
    assert parse_value("retry_backoff_s", "10, 20") == (10.0, 20.0)
    assert parse_value("retry_backoff_s", "[1, 2]") == (1.0, 2.0)
    assert parse_value("host_tags", "gpu,docker") == ("gpu", "docker")
    assert parse_value("host_tags", "") == ()
    assert parse_value("store", "postgresql://u@h/db") == "postgresql://u@h/db"
    assert parse_value("default_model", '"opus"') == "opus"
    assert parse_value("default_model", "none") is None
    for key, text, pattern in [
        ("max_concurrent", "many", "max_concurrent must be a whole number"),
        ("max_concurrent", "0", "max_concurrent must be at least 1"),
        ("max_concurrent", "2.5", "max_concurrent must be a whole number"),
        ("on_quit", "later", "on_quit must be 'ask' or 'leave' or 'stop'"),
        ("default_coder", "none", None),  # not optional: "none" is just a (bad later) name
        ("max_concurent", "3", "unknown config key 'max_concurent' — did you mean 'max_concurrent'?"),
    ]:
        if pattern is None:
            assert parse_value(key, text) == text
            continue
        with pytest.raises(ConfigError, match=pattern):
            parse_value(key, text)


def test_get_value(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "max_concurrent = 6\nhost_tags = ['a', 'b']\n")
    assert get_value(path, "max_concurrent") == "6"
    assert get_value(path, "host_tags") == '["a", "b"]'  # arrays as TOML, as the file has them
    assert get_value(path, "default_model") == "none"
    assert get_value(path, "rate_limit_threshold") == "0.9"
    assert get_value(path, "retry_backoff_s") == "[30, 120, 480]"
    assert get_value(path, "keep_worktrees") == "false"
    with pytest.raises(ConfigError, match="did you mean 'host_tags'"):
        get_value(path, "host_tag")
    # what get prints, set reads back
    for key in KEYS:
        set_value(path, key, get_value(path, key))
    assert load_config(path) == Config(max_concurrent=6, host_tags=("a", "b"))


SAMPLE = """
# My fleet settings.
# Keep this small.

max_concurrent = 2   # laptop

# retries
max_retries = 1


# end
"""


def test_set_preserves_comments_and_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", SAMPLE)
    set_value(path, "max_concurrent", "5")
    set_value(path, "host_tags", "gpu")
    text = path.read_text()
    expected = textwrap.dedent(SAMPLE).lstrip("\n").replace("max_concurrent = 2 ", "max_concurrent = 5 ")
    assert text == expected + 'host_tags = ["gpu"]\n'
    assert load_config(path) == Config(max_concurrent=5, max_retries=1, host_tags=("gpu",))
    set_value(path, "host_tags", "")
    set_value(path, "default_model", "opus")
    set_value(path, "default_model", "none")
    assert "default_model" not in path.read_text()
    assert "# laptop" in path.read_text() and "\n\n\n# end\n" in path.read_text()


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    """A config.toml saved with a UTF-8 byte order mark (a Windows editor's) loads, and
    ``config set`` edits it; the mark was a TOML error on line 1."""
    path = tmp_path / "config.toml"
    path.write_bytes(b"\xef\xbb\xbfmax_concurrent = 3\r\n")
    assert load_config(path).max_concurrent == 3
    set_value(path, "max_retries", "2")
    assert load_config(path) == Config(max_concurrent=3, max_retries=2)


def test_set_rejects_bad_values_and_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", SAMPLE)
    before = path.read_text()
    with pytest.raises(ConfigError, match="must be at least 1"):
        set_value(path, "max_concurrent", "0")
    with pytest.raises(ConfigError, match="unknown config key"):
        set_value(path, "max_concurent", "3")
    set_value(path, "lease_s", "60")
    with pytest.raises(ConfigError, match=r"heartbeat_s .* must be less than lease_s"):
        set_value(path, "heartbeat_s", "90")
    assert load_config(path).heartbeat_s == 5.0
    assert path.read_text() == before + "lease_s = 60\n"


def test_set_on_missing_file_uses_the_commented_default(tmp_path: Path) -> None:
    path = tmp_path / "home" / "config.toml"
    set_value(path, "default_model", "opus")
    set_value(path, "max_concurrent", "7")
    text = path.read_text()
    assert 'default_model = "opus"\n' in text and "# default_model =" not in text
    assert "\nmax_concurrent = 7\n" in text and "# agents running at once" in text
    assert load_config(path) == Config(default_model="opus", max_concurrent=7)


def test_default_file_loads_to_defaults_and_every_line_uncomments(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert write_default(path) is True
    assert write_default(path) is False  # never clobbers
    assert path.read_text() == default_text()
    assert load_config(path) == Config()
    # uncommenting every example line gives a valid file
    uncommented = "\n".join(
        line[2:] if line.startswith("# ") and " = " in line and line[2:].split(" ")[0] in KEYS else line
        for line in default_text().splitlines()
    )
    path.write_text(uncommented)
    cfg = load_config(path)
    assert cfg.max_concurrent == 4 and cfg.store is not None


def test_watcher_detects_change(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "max_concurrent = 2\n")
    w = ConfigWatcher(path)
    assert w.current.max_concurrent == 2
    assert w.poll() == (None, None)
    bump(path, "max_concurrent = 3\n")
    new, err = w.poll()
    assert err is None and new is not None and new.max_concurrent == 3
    assert w.current is new
    assert w.poll() == (None, None)
    bump(path, "max_concurrent = 3\n# only a comment\n")
    assert w.poll() == (None, None)  # same values: nothing to apply


def test_watcher_same_size_same_mtime_edit_is_seen(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "max_concurrent = 2\n")
    w = ConfigWatcher(path)
    st = path.stat()
    path.write_text("max_concurrent = 7\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    new, _ = w.poll()
    assert new is not None and new.max_concurrent == 7


def test_watcher_broken_edit_keeps_last_good_and_reports_once(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "max_concurrent = 2\n")
    w = ConfigWatcher(path)
    bump(path, "max_concurrent = \n")
    new, err = w.poll()
    assert new is None and err is not None and "bad TOML" in err and "keeping the last good config" in err
    assert w.current.max_concurrent == 2
    assert w.poll() == (None, None)  # reported once
    bump(path, "max_concurent = 3\n")
    new, err = w.poll()
    assert new is None and err is not None and f"{path}:1: unknown config key 'max_concurent'" in err
    bump(path, "max_concurrent = 2\n")  # fixed, back to the same values: say so
    new, err = w.poll()
    assert err is None and new == Config(max_concurrent=2)


def test_watcher_file_created_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    w = ConfigWatcher(path)
    assert w.current == Config() and w.poll() == (None, None)
    bump(path, "max_concurrent = 9\n")
    new, _ = w.poll()
    assert new is not None and new.max_concurrent == 9
    path.unlink()
    new, err = w.poll()
    assert err is None and new == Config()


def test_watcher_starting_on_a_broken_file_reports_on_first_poll(tmp_path: Path) -> None:
    path = write(tmp_path / "config.toml", "max_concurrent = 0\n")
    w = ConfigWatcher(path)
    assert w.current == Config()
    new, err = w.poll()
    assert new is None and err is not None and "max_concurrent must be at least 1" in err
    assert w.poll() == (None, None)


def test_parse_value_edge_cases() -> None:
    assert parse_value("stall_min", ".5") == 0.5
    assert parse_value("stall_min", "1e1") == 10.0
    assert parse_value("host_tags", "a,, b ,") == ("a", "b")
    assert parse_value("host_tags", '["x y", "z"]') == ("x y", "z")
    for key, text, pattern in [
        ("stall_min", "nan", "finite"),
        ("budget_usd_daily", "inf", "finite"),
        ("retry_backoff_s", "[1, 2", "array of numbers"),
        ("retry_backoff_s", "1, x", "retry_backoff_s must be an array of numbers, got 'x'"),
        ("max_concurrent", "3\nfoo = 1", "whole number"),
    ]:
        with pytest.raises(ConfigError, match=pattern):
            parse_value(key, text)
