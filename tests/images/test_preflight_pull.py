"""Pulls that fail fast and show progress: a refused registry port is one attempt and an error
naming the registry; a pull tells its observer the layers and bytes it transferred; the
default observer writes one line per image where stderr is not a terminal."""

from __future__ import annotations

import socket
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from registry import Registry, push_layers, tools_missing
from requirements import needs

import sandlot.images.pulling as pulling
from sandlot.cli.main import cli
from sandlot.images import ImageError, open_image, pull
from sandlot.images.progress import LineObserver
from sandlot.images.reference import parse
from sandlot.images.remote import check_remote
from sandlot.images.store import ImageStore

FILE = tarfile.REGTYPE


def _skopeo_missing() -> str | None:
    import shutil

    return None if shutil.which("skopeo") else "skopeo is not installed (apt-get install skopeo)"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Recorder:
    """A :class:`~sandlot.images.progress.PullObserver` that keeps every event."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def started(self, image: str) -> None:
        self.events.append(("started", image))

    def advanced(self, image: str, transferred: int, layers_done: int, layers: int) -> None:
        self.events.append(("advanced", image, transferred, layers_done, layers))

    def finished(self, image: str, transferred: int, seconds: float) -> None:
        self.events.append(("finished", image, transferred))


@needs(_skopeo_missing)
def test_a_refused_registry_port_fails_at_once_naming_the_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = []
    real = pulling._run_copy

    def counted(*args: object, **kwargs: object) -> tuple[int, str]:
        copies.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pulling, "_run_copy", counted)
    registry = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ImageError, match=f"nothing answers at the registry {registry}") as caught:
        pull(f"{registry}/x:1", ImageStore(tmp_path / "cache"))
    assert not caught.value.retryable  # so a sandbox start does not retry it either
    assert "connection refused" in str(caught.value)
    assert len(copies) == 1  # one skopeo run, no retries


@needs(_skopeo_missing)
def test_the_registry_check_names_a_refused_registry(tmp_path: Path) -> None:
    registry = f"127.0.0.1:{_closed_port()}"
    ref = parse(f"{registry}/x:1")
    assert ref is not None
    with pytest.raises(ImageError, match=f"registry {registry} .connection refused.") as caught:
        check_remote(ref)
    assert not caught.value.retryable


@needs(tools_missing)
def test_the_registry_check_finds_a_pushed_image_and_not_a_missing_tag(
    registry: Registry, tmp_path: Path
) -> None:
    ref = push_layers(registry, tmp_path, [[("a", FILE, "a")]])
    found = parse(ref)
    assert found is not None
    check_remote(found)  # no error
    missing = parse(ref.rsplit(":", 1)[0] + ":nosuch")
    assert missing is not None
    with pytest.raises(ImageError, match="manifest unknown"):
        check_remote(missing)


@needs(tools_missing)
def test_a_pull_tells_its_observer_layers_and_bytes(registry: Registry, tmp_path: Path) -> None:
    ref = push_layers(registry, tmp_path, [[("a", FILE, "a" * 5000)], [("b", FILE, "b")]])
    recorder = Recorder()
    result = pull(ref, ImageStore(tmp_path / "cache"), unpack=False, observer=recorder)
    kinds = [event[0] for event in recorder.events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert set(kinds[1:-1]) == {"advanced"}  # at least the last look, after the copy
    last = recorder.events[-2]
    assert last[3:] == (2, 2)  # both layers named by skopeo, both in the cache
    assert last[2] == result.transferred == recorder.events[-1][2] > 0


@needs(tools_missing)
def test_a_pull_a_sandbox_start_triggers_is_one_line_on_a_pipe(
    registry: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = push_layers(registry, tmp_path, [[("a", FILE, "a")], [("b", FILE, "b")]])
    store = ImageStore(tmp_path / "cache")
    open_image(ref, store)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pulled {ref}: ")
    open_image(ref, store)  # cached: nothing to say
    assert capsys.readouterr().err == ""


@needs(tools_missing)
def test_sandlot_image_pull_on_a_pipe_says_one_line_per_image(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = [push_layers(registry, tmp_path, [[(name, FILE, name)]]) for name in ("a", "b")]
    monkeypatch.setenv("SANDLOT_IMAGE_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["image", "pull", "--fetch-only", *refs])
    assert result.exit_code == 0, result.output
    for ref in refs:
        said = [line for line in result.output.splitlines() if ref in line and "/2]" in line]
        assert len(said) == 1, result.output
    # the default observer's lines are not added to the command's own
    assert not any(line.startswith("pulled ") for line in result.output.splitlines())


def test_the_line_observer_shows_layers_only_on_a_terminal() -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    pipe, tty = io.StringIO(), Tty()
    for stream in (pipe, tty):
        observer = LineObserver(stream)
        observer.started("img")
        observer.advanced("img", 10, 0, 2)
        observer.advanced("img", 2048, 1, 2)
        observer.advanced("img", 2048, 1, 2)  # no news: no line
        observer.advanced("img", 4096, 2, 2)
        observer.finished("img", 4096, 1.5)
    assert pipe.getvalue() == "pulled img: 4.0 KiB transferred in 1.5 s\n"
    assert tty.getvalue().splitlines() == [
        "pulling img",
        "  img: 1/2 layers, 2.0 KiB transferred",
        "  img: 2/2 layers, 4.0 KiB transferred",
        "pulled img: 4.0 KiB transferred in 1.5 s",
    ]
