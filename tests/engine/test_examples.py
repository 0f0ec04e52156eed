"""The shipped example task file loads cleanly and its sim directives are all understood."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_tui.taskfile import load_taskfile

pytestmark = pytest.mark.timeout(60)

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "fleet_tui" / "examples" / "tasks.toml"
CODERS = ("claude", "codex", "opencode", "gemini", "shell", "sim")


def test_example_tasks_validate() -> None:
    res = load_taskfile(EXAMPLE, known_coders=CODERS)
    assert [str(e) for e in res.errors] == []
    assert [str(w) for w in res.warnings] == []
    names = [s.name for s in res.specs]
    assert 4 <= len(names) <= 6
    assert all(s.coder == "sim" for s in res.specs)
    assert any(s.depends_on for s in res.specs)
    assert len({s.priority for s in res.specs}) > 1
    assert any(v.kind == "run" and v.run == "test -f hello.txt" for s in res.specs for v in s.verify)
    assert all(s.cwd == str(EXAMPLE.parent) for s in res.specs)


def test_example_prompts_use_known_sim_directives() -> None:
    from fleet_tui.coders import sim_agent

    for spec in load_taskfile(EXAMPLE, known_coders=CODERS).specs:
        plan = sim_agent.parse(spec.prompt)
        assert plan.warnings == [], (spec.name, plan.warnings)
        assert plan.actions, spec.name


def test_example_runs_under_the_sim_agent_and_its_verifiers_pass(tmp_path: Path) -> None:
    """Without the engine: run each prompt through the sim agent in dependency order, then check
    the verifiers by hand, so the example stays runnable when the directives change."""
    import os
    import subprocess
    import sys

    copy = tmp_path / "tasks.toml"
    copy.write_text(EXAMPLE.read_text())
    specs = {s.name: s for s in load_taskfile(copy, known_coders=CODERS).specs}
    done: list[str] = []
    while len(done) < len(specs):
        ready = [s for s in specs.values() if s.name not in done and set(s.depends_on) <= set(done)]
        spec = max(ready, key=lambda s: s.priority)
        for attempt in range(1, (spec.max_retries or 0) + 2):
            env = {**os.environ, "FLEET_PROMPT": spec.prompt, "FLEET_ATTEMPT": str(attempt)}
            env.pop("FLEET_MCP_COMMAND", None)
            proc = subprocess.run(
                [sys.executable, "-m", "fleet_tui.coders.sim_agent"],
                cwd=spec.cwd, env=env, capture_output=True, timeout=30, check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                break
        assert proc.returncode == 0, (spec.name, proc.stderr)
        for v in spec.verify:
            if v.kind == "run":
                assert subprocess.run(v.run or "", shell=True, cwd=spec.cwd).returncode == 0, v.label
            else:
                text = (Path(spec.cwd) / (v.path or "")).read_text()
                assert len(text) >= v.min_chars and all(c in text for c in v.contains), v.label
        done.append(spec.name)
    assert (tmp_path / "notes.md").read_text().count("reviewed") == 1
