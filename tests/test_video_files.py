"""Video files (pipelines.video.files): a clip written as MP4, WebP, GIF or PNG frames reads back with its
frames, rate, duration, colours, parameters and metadata; bad input is refused by name; and the MP4 plays
in a real browser (Debian chromium driven by Playwright, served over HTTP with range requests).

The browser tests are `slow` (they start chromium); elsewhere they are skipped with a printed reason
when /usr/bin/chromium is absent, and fail in CI (CI=1), as tests/test_browser.py's.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.video.files import FORMATS, SUFFIXES, VideoInfo, is_video, read_frames, read_video, write_video

FRAMES, FPS, SIDE = 17, 8, 64
BLUE, RED = (0, 0, 255), (255, 0, 0)
# an A1111 infotext: several lines, text beyond Latin-1, markup characters, longer than a GIF comment block (255)
PARAMETERS = (
    "a red square on blue, café ✓ <b>&amp;</b>\nNegative prompt: blurry\n"
    "Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 42, Size: 64x64, Frames: 17, FPS: 8, "
    + ", ".join(f"Extra {i}: value {i}" for i in range(20))
)
METADATA = {"diffusion_anywhere": json.dumps({"seed": 42, "prompt": "a red square on blue, café ✓", "frames": 17})}
ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [  # tests/test_browser.py's
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def square_at(index: int, size: tuple[int, int] = (SIDE, SIDE)) -> Image.Image:
    """Frame `index` of the test clip: a 20x20 red square on blue, 2 px further right each frame (no two
    frames alike: WebP and GIF merge a frame into an identical one before it)."""
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[...] = BLUE
    pixels[20:40, 2 * index : 2 * index + 20] = RED
    return Image.fromarray(pixels)


def clip(count: int = FRAMES, size: tuple[int, int] = (SIDE, SIDE)) -> list[Image.Image]:
    return [square_at(i, size) for i in range(count)]


def mean_difference(a: Image.Image, b: Image.Image) -> float:
    return float(np.abs(np.asarray(a.convert("RGB"), float) - np.asarray(b.convert("RGB"), float)).mean())


def test_the_module_loads_neither_torch_nor_pyav():
    """Reading a clip's suffix or writing a GIF costs no runtime: PyAV loads at the first MP4, torch never."""
    code = (
        "import sys\nimport pipelines.video.files\n"
        "print(','.join(sorted(m for m in ('torch', 'diffusers', 'av', 'numpy') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing pipelines.video.files loaded {out.stdout.strip()}"


@pytest.fixture(scope="module")
def mp4(tmp_path_factory) -> Path:
    """The 17-frame 64x64 clip at 8 fps, written once as MP4 with its parameters and metadata."""
    return write_video(clip(), FPS, tmp_path_factory.mktemp("mp4") / "clip.mp4", PARAMETERS, METADATA)


def test_an_mp4_reads_back_every_frame_at_its_rate(mp4):
    info = read_video(mp4)
    assert isinstance(info, VideoInfo)
    assert (info.frames, info.fps, info.width, info.height, info.format) == (FRAMES, FPS, SIDE, SIDE, "mp4")
    assert info.duration == pytest.approx(FRAMES / FPS, rel=0.05)
    assert info.duration == pytest.approx(FRAMES / FPS, abs=1e-6)  # the time base is 1/fps: exactly 2.125 s
    assert len(read_frames(mp4)) == FRAMES


def test_the_mp4_is_h264_yuv420p_with_its_index_first(mp4):
    """What a browser needs: H.264 in yuv420p (4:2:0, 8 bits), and the moov atom before the media data so
    playback starts before the file has loaded."""
    import av

    with av.open(str(mp4)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
    data = mp4.read_bytes()
    boxes, pos = [], 0
    while pos + 8 <= len(data):
        boxes.append(data[pos + 4 : pos + 8].decode("latin-1"))
        pos += int.from_bytes(data[pos : pos + 4], "big")
    assert boxes[0] == "ftyp" and boxes.index("moov") < boxes.index("mdat"), boxes


def test_the_mp4_carries_its_parameters_and_metadata(mp4):
    import av

    info = read_video(mp4)
    assert info.parameters == PARAMETERS
    assert info.metadata == METADATA
    with av.open(str(mp4)) as container:  # what ffprobe and other tools show: the comment tag, our key beside it
        assert container.metadata["comment"] == PARAMETERS
        assert json.loads(container.metadata["diffusion_anywhere"])["seed"] == 42


def test_colours_and_motion_survive_the_mp4(mp4):
    frames = read_frames(mp4)
    assert all(frame.mode == "RGB" and frame.size == (SIDE, SIDE) for frame in frames)
    differences = [mean_difference(got, want) for got, want in zip(frames, clip(), strict=True)]
    assert max(differences) < 4, differences
    middle = np.asarray(frames[8], int)  # the square at x 16..35 in frame 8
    assert np.abs(middle[30, 25] - RED).max() < 12 and np.abs(middle[5, 5] - BLUE).max() < 12
    assert np.abs(middle[30, 5] - BLUE).max() < 12  # where the square was in frame 0: it moved


@pytest.mark.parametrize("fps", [24000 / 1001, 7.5, 30])
def test_an_mp4_lasts_frames_over_fps_at_any_rate(tmp_path, fps):
    info = read_video(write_video(clip(10, (16, 16)), fps, tmp_path / "clip.mp4"))
    assert info.frames == 10
    assert info.fps == pytest.approx(fps, rel=1e-9)
    assert info.duration == pytest.approx(10 / fps, abs=1e-6)


def test_odd_sizes_are_padded_to_even_in_mp4_only(tmp_path):
    frames = [square_at(i, (63, 47)) for i in range(4)]
    info = read_video(write_video(frames, FPS, tmp_path / "odd.mp4"))
    assert (info.width, info.height, info.frames) == (64, 48, 4)
    decoded = np.asarray(read_frames(tmp_path / "odd.mp4")[0], int)
    assert np.abs(decoded[47, 10] - decoded[46, 10]).max() < 12  # the added row repeats the last one (blue)
    assert np.abs(decoded[30, 63] - BLUE).max() < 12
    assert mean_difference(Image.fromarray(decoded[:47, :63].astype(np.uint8)), frames[0]) < 4
    webp = read_video(write_video(frames, FPS, tmp_path / "odd.webp"))
    assert (webp.width, webp.height) == (63, 47)


@pytest.mark.parametrize(
    "fmt, tolerance, keeps_metadata",
    [("webp", 6, True), ("gif", 1, False), ("png", 0, True)],
)
def test_webp_gif_and_png_frames_round_trip(tmp_path, fmt, tolerance, keeps_metadata):
    path = write_video(clip(), FPS, tmp_path / f"clip{SUFFIXES[fmt]}", PARAMETERS, METADATA)
    info = read_video(path)
    assert (info.frames, info.width, info.height, info.format) == (FRAMES, SIDE, SIDE, fmt)
    assert info.duration == pytest.approx(FRAMES / FPS, rel=0.05)
    assert info.fps == pytest.approx(FPS, rel=0.05)
    assert info.parameters == PARAMETERS
    assert info.metadata == (METADATA if keeps_metadata else {})  # GIF has one comment: the parameters
    frames = read_frames(path)
    assert len(frames) == FRAMES and all(frame.mode == "RGB" for frame in frames)
    assert max(mean_difference(got, want) for got, want in zip(frames, clip(), strict=True)) <= tolerance
    assert is_video(path)


def test_a_zip_holds_one_png_per_frame_each_with_its_parameters(tmp_path):
    from pipelines.pnginfo.files import read_text

    path = write_video(clip(3), FPS, tmp_path / "clip.zip", PARAMETERS, METADATA)
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["frame_00000.png", "frame_00001.png", "frame_00002.png"]
        texts = [read_text(archive.open(name))[0] for name in archive.namelist()]
    assert all(text["parameters"] == PARAMETERS and text["diffusion_anywhere"] == METADATA["diffusion_anywhere"] for text in texts)


def test_the_png_info_reader_finds_the_parameters_of_a_webp_and_a_gif(tmp_path):
    """The app's PNG Info reader (EXIF UserComment, XMP, GIF comment) shows a clip's parameters."""
    from pipelines.pnginfo.files import read_text

    for suffix in (".webp", ".gif"):
        text, _ = read_text(write_video(clip(3), FPS, tmp_path / f"clip{suffix}", PARAMETERS, METADATA))
        assert text["parameters"] == PARAMETERS, suffix


def test_webp_and_gif_merge_still_frames_but_keep_the_length(tmp_path):
    """A documented limit of both formats: a frame identical to the one before it is merged into it (its
    time added), so a still stretch reads back as fewer frames, never as a shorter clip."""
    frames = [square_at(0)] * 4 + [square_at(1)] * 4
    for suffix in (".webp", ".gif"):
        info = read_video(write_video(frames, FPS, tmp_path / f"still{suffix}"))
        assert info.frames == 2 and info.duration == pytest.approx(1.0, abs=0.02), (suffix, info)
    assert read_video(write_video(frames, FPS, tmp_path / "still.mp4")).frames == 8


def test_is_video_knows_clips_from_pictures(tmp_path, mp4):
    renamed = tmp_path / "clip.bin"
    shutil.copy(mp4, renamed)
    clips = [renamed, *(write_video(clip(3), FPS, tmp_path / f"c{SUFFIXES[f]}") for f in FORMATS if f != "mp4")]
    square_at(0).save(tmp_path / "still.png")
    square_at(0).save(tmp_path / "still.gif")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("readme.txt", "not frames")
    (tmp_path / "notes.mp4").write_text("not a video")
    pictures = ["still.png", "still.gif", "other.zip", "notes.mp4", "missing.mp4", "."]
    assert [is_video(path) for path in clips] == [True] * 4
    assert [is_video(tmp_path / name) for name in pictures] == [False] * len(pictures)
    write_video([square_at(0)], FPS, tmp_path / "one.webp")
    assert not is_video(tmp_path / "one.webp")  # one frame: Pillow writes a still WebP
    with pytest.raises(ValueError, match="not a video file"):
        read_video(tmp_path / "still.png")


@pytest.mark.parametrize(
    "frames, fps, name, metadata, message",
    [
        ([], FPS, "clip.mp4", None, "no frames"),
        ([square_at(0), square_at(0, (32, 32))], FPS, "clip.mp4", None, "frame 1 is 32x32"),
        (clip(2), 0, "clip.mp4", None, "fps must be a positive number"),
        (clip(2), -8, "clip.gif", None, "fps must be a positive number"),
        (clip(2), float("nan"), "clip.webp", None, "fps must be a positive number"),
        (clip(2), FPS, "clip.avi", None, "unknown video suffix '.avi'"),
        (clip(2), FPS, "clip", None, "unknown video suffix"),
        (clip(2), FPS, "clip.mp4", {"comment": "x"}, "metadata key 'comment'"),
        (clip(2), FPS, "clip.webp", {"has space": "x"}, "metadata key 'has space'"),
        (clip(2), FPS, "clip.zip", {"seed": 42}, "metadata 'seed' must be text"),
    ],
)
def test_bad_clips_are_refused_by_name_and_leave_no_file(tmp_path, frames, fps, name, metadata, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        write_video(frames, fps, tmp_path / name, PARAMETERS, metadata)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_clip_that_was_there(tmp_path, monkeypatch):
    import pipelines.video.files as files

    path = write_video(clip(3), FPS, tmp_path / "clip.mp4")
    before = path.read_bytes()
    real, seen = files._even, []

    def fail_on_the_third(image):
        seen.append(image)
        if len(seen) == 3:
            raise OSError("disk full")
        return real(image)

    monkeypatch.setattr(files, "_even", fail_on_the_third)
    with pytest.raises(OSError, match="disk full"):
        write_video(clip(), FPS, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]  # no *.part left behind


# --- in a browser --------------------------------------------------------------------------------------


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with single byte ranges (206 Partial Content), as a real web server answers a <video>:
    without them chromium plays the file but cannot seek it (`seekable` stays empty)."""

    def send_head(self):
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if not match or not path.is_file():
            return super().send_head()
        size = path.stat().st_size
        first, last = match.groups()
        start = int(first) if first else max(0, size - int(last))
        end = min(int(last), size - 1) if first and last else size - 1
        body = path.open("rb")
        body.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(str(path)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        return _Limited(body, end - start + 1)  # do_GET copies it out and closes it

    def log_message(self, *args):
        pass


class _Limited:
    """The first `length` bytes from where `file` stands."""

    def __init__(self, file, length):
        self.file, self.left = file, length

    def read(self, size=-1):
        chunk = self.file.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(chunk)
        return chunk

    def close(self):
        self.file.close()


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail(f"chromium not found at {CHROMIUM}; CI must run the browser test (apt-get install chromium)")
        pytest.skip(f"chromium not installed at {CHROMIUM} (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


SHOW = """async ([src, at]) => {
  const v = document.getElementById('v');
  v.src = src;
  await new Promise((ok, no) => { v.oncanplay = ok; v.onerror = () => no(new Error('video error ' + v.error.code)); });
  if (at > 0) { v.currentTime = at; await new Promise(ok => { v.onseeked = ok; }); }
  const c = document.createElement('canvas');
  c.width = v.videoWidth; c.height = v.videoHeight;
  const g = c.getContext('2d', {willReadFrequently: true});
  // Chrome for Testing can draw a not-yet-painted (black) frame right after canplay/seeked: draw again
  // on the next animation frames until the frame has any pixel (bounded; a black clip still fails)
  for (let i = 0; i < 60; i++) {
    g.drawImage(v, 0, 0);
    if (g.getImageData(0, 0, c.width, c.height).data.some((x, j) => j % 4 !== 3 && x > 0)) break;
    await new Promise(ok => requestAnimationFrame(ok));
  }
  return {readyState: v.readyState, duration: v.duration, width: v.videoWidth, height: v.videoHeight,
          time: v.currentTime, seekable: v.seekable.length ? v.seekable.end(0) : 0,
          png: c.toDataURL('image/png')};
}"""


def shown(page, src: str, at: float = 0.0) -> tuple[dict, np.ndarray]:
    """What the page's <video> shows of `src` at `at` seconds: its state, and the frame as RGB pixels."""
    state = page.evaluate(SHOW, [src, at])
    png = base64.b64decode(state.pop("png").partition(",")[2])
    return state, np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), int)


@pytest.mark.slow  # starts chromium (the browser tier): ~5 s here
def test_the_mp4_plays_in_chromium(browser, mp4, tmp_path):
    shutil.copy(mp4, tmp_path / "clip.mp4")
    (tmp_path / "index.html").write_text('<!doctype html><video id="v" muted preload="auto"></video>')
    page = browser.new_page()
    with serving(tmp_path) as url:
        page.goto(f"{url}/index.html")
        supports = page.evaluate("""() => document.createElement('video').canPlayType('video/mp4; codecs="avc1.42E01E"')""")
        assert supports == "probably", f"this chromium does not play H.264: canPlayType says {supports!r}"
        state, first = shown(page, f"{url}/clip.mp4")
        assert state["readyState"] >= 2 and (state["width"], state["height"]) == (SIDE, SIDE), state
        assert state["duration"] == pytest.approx(FRAMES / FPS, rel=0.05), state
        # seekable from the first load: the server answers byte ranges (a plain 200 leaves `seekable` empty)
        assert state["seekable"] == pytest.approx(FRAMES / FPS, rel=0.05), state
        assert np.abs(first[5:15, 45:60] - BLUE).max() < 10 and np.abs(first[25:35, 5:15] - RED).max() < 10
        state, later = shown(page, f"{url}/clip.mp4?again", at=1.0)  # frame 8 (a new URL: not the cached copy)
        assert state["time"] == pytest.approx(1.0), state
        assert np.abs(later[25:35, 20:32] - RED).max() < 10 and np.abs(later[25:35, 2:12] - BLUE).max() < 10
        ended = page.evaluate(
            """async () => { const v = document.getElementById('v'); v.currentTime = 0; await v.play();
               await new Promise(ok => { if (v.ended) ok(); else v.onended = ok; }); return v.currentTime; }"""
        )
        assert ended == pytest.approx(FRAMES / FPS, rel=0.05)
    page.close()


@pytest.mark.slow  # starts chromium (the browser tier): ~3 s here
def test_colours_are_right_in_chromium_at_hd_size(browser, tmp_path):
    """At 720 lines chromium takes an untagged clip for BT.709; our clips say their matrix (BT.601), so a
    saturated green stays green (untagged, ffmpeg's default, it shows as (0, 216, 2))."""
    colours = [(0, 0, 255), (255, 0, 0), (0, 255, 0), (128, 128, 128), (200, 150, 50)]
    stripes = np.zeros((720, 1280, 3), np.uint8)
    for i, colour in enumerate(colours):
        stripes[:, 256 * i : 256 * (i + 1)] = colour
    write_video([Image.fromarray(stripes)] * 2, FPS, tmp_path / "hd.mp4")
    (tmp_path / "index.html").write_text('<!doctype html><video id="v" muted preload="auto"></video>')
    page = browser.new_page()
    with serving(tmp_path) as url:
        page.goto(f"{url}/index.html")
        state, frame = shown(page, f"{url}/hd.mp4")
    page.close()
    assert (state["width"], state["height"]) == (1280, 720)
    seen = [frame[300:420, 256 * i + 64 : 256 * i + 192].reshape(-1, 3).mean(axis=0).round().tolist() for i in range(5)]
    assert all(np.abs(np.subtract(got, want)).max() <= 6 for got, want in zip(seen, colours, strict=True)), seen
