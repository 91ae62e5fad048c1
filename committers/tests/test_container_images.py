"""``tools/containers.py``: an image's tag is a digest of its inputs, so a changed Dockerfile or
binary builds a new image and an unchanged one is reused; an image without its inputs has no
tag. Needs no Docker engine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from committers.tests._jars import tool


@pytest.fixture
def containers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    module = tool("containers")
    docker = tmp_path / "docker"
    shutil.copytree(module.DOCKER_DIR / "seaweedfs", docker / "seaweedfs")
    weed = tmp_path / "weed"
    weed.write_bytes(b"a static binary")
    monkeypatch.setattr(module, "DOCKER_DIR", docker)
    monkeypatch.setattr(module, "weed_binary", lambda: weed)
    return module, docker, weed


def test_a_tag_names_the_image_and_changes_with_each_input(containers) -> None:  # type: ignore[no-untyped-def]
    module, docker, weed = containers
    first = module.image_tag("seaweedfs")
    assert first is not None and first.startswith("sparksink/seaweedfs:")
    assert module.image_tag("seaweedfs") == first  # unchanged inputs: the same image

    dockerfile = docker / "seaweedfs" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "# changed\n")
    second = module.image_tag("seaweedfs")
    assert second != first

    weed.write_bytes(b"another build of the binary")
    os.utime(weed, (1, 1))
    assert module.image_tag("seaweedfs") not in (first, second)


def test_an_image_without_its_inputs_has_no_tag(containers, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    module, _, _ = containers
    monkeypatch.setattr(module, "weed_binary", lambda: None)
    assert module.image_tag("seaweedfs") is None
    with pytest.raises(ValueError, match="unknown image"):
        module.image_tag("postgres")
