"""The repository stands on its own: nothing under ``tests/`` or ``bench/`` reaches outside it,
the example task file ships inside the package, and the code keeps one style.

Why: the tests once read recorded CLI streams from a ``shared/`` folder that sat beside the
checkout on the development machines only; a fresh clone failed. These checks keep such a
dependency from creeping back, and keep ``ruff format``/``ruff check``/``mypy`` from drifting.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "bench")
TEXT_SUFFIXES = {".py", ".toml", ".sh", ".md", ".txt", ".cfg", ".ini", ".json", ".yaml", ".yml"}

# Spellings of a path outside the repository: the old shared folder, machine paths, and
# ``Path(__file__).parents[N]`` / ``ROOT.parent`` climbing above the repository root.
OUTSIDE = [
    re.compile(r"\.\./shared\b"),
    re.compile(r"[\"']shared[\"']\s*/"),
    re.compile(r"Path\(\s*[rf]?[\"']/(work|root|home|opt|srv|mnt)\b"),
    re.compile(r"\bROOT\.parent\b"),
]
PARENTS = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")


def _scanned_files() -> list[Path]:
    out = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                out.append(p)
    return out


def outside_references(path: Path) -> list[str]:
    """Each line of ``path`` that names a place outside the repository, as ``file:line: text``."""
    rel = path.relative_to(ROOT)
    depth = len(rel.parts) - 1  # parents[depth] is the repository root
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        bad = any(rx.search(line) for rx in OUTSIDE)
        bad = bad or any(int(m.group(1)) > depth for m in PARENTS.finditer(line))
        if bad:
            found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_no_test_or_benchmark_refers_outside_the_repository() -> None:
    files = _scanned_files()
    assert len(files) > 20
    assert [hit for f in files if f != Path(__file__) for hit in outside_references(f)] == []


def test_the_outside_check_catches_what_it_should(tmp_path: Path) -> None:
    depth = 2  # a file in tests/coders/: parents[2] is the root, parents[3] is above it
    lines = {
        'STREAMS = Path(__file__).resolve().parents[3] / "shared"': True,
        'STREAMS = Path(__file__).resolve().parents[2] / "x"': False,
        'STREAMS = Path(__file__).resolve().parents[1] / "fixtures"': False,
        'x = "../shared/fixtures/streams"': True,
        'x = Path("/work/main/tests")': True,
        'x = "update /home/dev/repo/a.py"': False,  # recorded text, not a path the test reads
        "x = ROOT.parent / 'y'": True,
    }
    for text, bad in lines.items():
        hit = any(rx.search(text) for rx in OUTSIDE) or any(
            int(m.group(1)) > depth for m in PARENTS.finditer(text)
        )
        assert hit is bad, text


def test_recorded_streams_live_in_the_repository() -> None:
    streams = ROOT / "tests" / "fixtures" / "streams"
    for coder in ("claude", "codex", "opencode", "gemini"):
        assert list(streams.glob(f"{coder}-*.jsonl")), coder
    assert (streams / "PROVENANCE.md").is_file()


def test_example_command_prints_the_packaged_file_and_it_validates(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "fleet-tui"
    out = subprocess.run([str(exe), "example"], capture_output=True, text=True, timeout=60, check=True)
    packaged = ROOT / "src" / "fleet_tui" / "examples" / "tasks.toml"
    assert out.stdout == packaged.read_text(encoding="utf-8")
    (tmp_path / "tasks.toml").write_text(out.stdout)
    val = subprocess.run(
        [str(exe), "--home", str(tmp_path / "home"), "validate", str(tmp_path / "tasks.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert val.returncode == 0, val.stderr


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    if not exe.exists():
        pytest.fail(f"{name} is missing: install the dev extras (pip install -e '.[dev]')")
    return str(exe)


def test_ruff_format_is_clean() -> None:
    r = subprocess.run(
        [_tool("ruff"), "format", "--check", "src", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr + "\nfix: ruff format src tests bench"


def test_ruff_check_is_clean() -> None:
    cmd = [_tool("ruff"), "check", "src", "tests", "bench"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(300)
def test_mypy_is_clean() -> None:
    # the files come from pyproject.toml: the package, and the tests and benchmarks too
    files = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["files"]
    assert set(files) >= {"src/fleet_tui", "tests", "bench"}
    r = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=290)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_readme_and_ci_test_command_run_these_checks() -> None:
    # ``pytest -q`` with no path, marker or keyword collects this file (testpaths), so the
    # format, lint and type checks above run wherever the README's command or .ci/run does
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert ".venv/bin/pip install -e '.[dev]' && .venv/bin/pytest -q\n" in readme
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert ".venv/bin/pytest -q -p no:cacheprovider" in ci
