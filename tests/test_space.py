"""The repo as a Hugging Face Space: the front matter the Hub accepts, the build the Spaces builder
runs, and the LFS rules the Hub needs for binary files (docs/spaces.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# Every key of https://huggingface.co/docs/hub/spaces-config-reference (hub-docs, checked 2026-11),
# plus the repository-card keys the Hub reads on any repo (license, tags, datasets, models).
SPACE_KEYS = {
    "title", "emoji", "colorFrom", "colorTo", "sdk", "python_version", "sdk_version",
    "suggested_hardware", "suggested_storage", "app_file", "app_build_command", "app_port",
    "base_path", "fullWidth", "header", "short_description", "models", "datasets", "tags",
    "thumbnail", "pinned", "hf_oauth", "hf_oauth_scopes", "hf_oauth_expiration_minutes",
    "hf_oauth_authorized_org", "disable_embedding", "startup_duration_timeout", "custom_headers",
    "preload_from_hub", "license",
}  # fmt: skip
ZEROGPU_PYTHONS = {"3.12.12", "3.10.13"}
COLORS = {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
HARDWARE = {
    "cpu-basic", "cpu-upgrade", "t4-small", "t4-medium", "l4x1", "l4x4", "l40sx1", "l40sx4", "l40sx8",
    "a10g-small", "a10g-large", "a10g-largex2", "a10g-largex4", "a100-large", "a100x4", "a100x8",
}  # fmt: skip
BINARY_LFS_PATTERNS = ("*.safetensors", "*.png", "*.jpg", "*.webp", "*.bin", "*.pt", "*.gguf")


def front_matter_text() -> str:
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n"), "README.md must open with the Space's YAML front matter"
    return text[4 : text.index("\n---\n", 4) + 1]


def front_matter() -> dict:
    config = yaml.safe_load(front_matter_text())
    assert isinstance(config, dict)
    return config


def pinned(name: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].split("#")[0].strip()
    raise AssertionError(f"{name} is not pinned in requirements.txt")


def test_front_matter_has_only_keys_the_hub_documents():
    config = front_matter()
    assert set(config) <= SPACE_KEYS, sorted(set(config) - SPACE_KEYS)
    assert {"title", "sdk", "sdk_version", "app_file", "short_description"} <= set(config)


def test_front_matter_values_the_hub_accepts():
    config = front_matter()
    assert isinstance(config["title"], str) and config["title"].strip()
    assert isinstance(config["short_description"], str) and 0 < len(config["short_description"]) <= 60
    assert config["sdk"] == "gradio"
    # the builder installs gradio==<sdk_version> beside requirements.txt: the two must be the same
    assert isinstance(config["sdk_version"], str) and config["sdk_version"] == pinned("gradio")
    assert (ROOT / config["app_file"]).is_file()
    assert isinstance(config["python_version"], str)  # unquoted 3.10 would read as the float 3.1
    assert config["python_version"].startswith("3.")
    # ZeroGPU runs only the Pythons its page documents (hub-docs spaces-zerogpu.md, 2026-08: 3.12.12
    # and 3.10.13), and diffusers 0.42 needs Python >= 3.11: one value serves every kind of Space
    assert config["python_version"] in ZEROGPU_PYTHONS
    assert tuple(int(n) for n in config["python_version"].split(".")[:2]) >= (3, 11)
    assert config["colorFrom"] in COLORS and config["colorTo"] in COLORS
    assert isinstance(config.get("pinned", False), bool)
    for key in ("models", "preload_from_hub", "tags", "datasets"):
        assert isinstance(config.get(key, []), list), key
    assert config.get("suggested_hardware", "cpu-basic") in HARDWARE


def test_front_matter_keeps_the_gpu_space_hints():
    """The commented-out lines docs/spaces.md tells GPU Space owners to uncomment."""
    text = front_matter_text()
    for hint in ("# models:", "# preload_from_hub:", "# suggested_hardware:"):
        assert hint in text, hint


def test_every_tracked_binary_file_is_an_lfs_file_and_no_text_file_is():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [p for p in files.decode().split("\0") if p and (ROOT / p).is_file()]
    out = subprocess.run(
        ["git", "check-attr", "-z", "filter", "--", *paths], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    fields = out.split("\0")
    lfs = {path for path, _, value in zip(fields[0::3], fields[1::3], fields[2::3], strict=False) if value == "lfs"}
    binary = {p for p in paths if b"\0" in (ROOT / p).read_bytes()[:8192]}
    assert binary, "expected the embedded models' safetensors"
    assert sorted(binary - lfs) == [], "binary files without an LFS rule in .gitattributes"
    assert sorted(lfs - binary) == [], "text files caught by an LFS rule"
    rules = (ROOT / ".gitattributes").read_text()
    for pattern in BINARY_LFS_PATTERNS:
        assert f"{pattern} filter=lfs diff=lfs merge=lfs -text" in rules, pattern


def test_generated_outputs_are_not_tracked():
    tracked = subprocess.run(["git", "ls-files", "outputs"], cwd=ROOT, capture_output=True, check=True, text=True)
    assert tracked.stdout == ""
    assert "outputs/" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.slow  # a pip resolve against the package index
@pytest.mark.timeout(660)
def test_the_spaces_builder_command_resolves(tmp_path):
    """Replays the Spaces builder's install (it mounts requirements.txt alone) as a pip dry run from
    a folder that holds nothing else: a nested `-r`, a pin conflicting with gradio==<sdk_version>,
    its oauth/mcp extras or `spaces`, or a pin missing from the index fails here. Needs the package
    index (about 40 s). --ignore-installed resolves as on the builder's fresh image, not against
    this environment."""
    shutil.copy(ROOT / "requirements.txt", tmp_path / "requirements.txt")
    sdk_version = front_matter()["sdk_version"]
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
        "--no-cache-dir", "-r", "requirements.txt", f"gradio[oauth,mcp]=={sdk_version}", "uvicorn", "websockets", "spaces",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in report["install"]}
    assert resolved["gradio"] == sdk_version
    for name in ("torch", "torchvision", "diffusers", "transformers", "gradio-client"):
        assert resolved[name] == pinned(name.replace("gradio-client", "gradio_client")), name
    assert "spaces" in resolved and "mcp" in resolved and "authlib" in resolved


def test_readme_points_to_the_spaces_guide():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Hugging Face Spaces", 1)[1]
    assert "(docs/spaces.md)" in section
    guide = (ROOT / "docs" / "spaces.md").read_text()
    for heading in ("## CPU Space", "## GPU Space", "## ZeroGPU", "## What the app changes by itself on a Space"):
        assert heading in guide, heading
