"""The Video tab's model in the app as `python app.py` builds it: the embedded tiny-shapes-video beside the
embedded image model, `/video` through gradio_client, clips that play and carry their parameters, the status
panel's row, and VIDEO_MODEL_ID=none."""

from __future__ import annotations

import numpy as np
import pytest
from gradio_client import Client, handle_file

from models.eval_video import Ask, score_clip
from pipelines import read_frames, read_png_info, read_video
from pipelines.run.options import DEFAULT_MODEL
from serving.video import EMBEDDED_VIDEO
from tests.app_server import embedded_model_available, running_app

pytestmark = pytest.mark.skipif(
    not (embedded_model_available() and (EMBEDDED_VIDEO / "model_index.json").is_file()),
    reason="needs the embedded models (models/tiny-shapes, models/tiny-shapes-video)",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs")
    with running_app(DEFAULT_MODEL, out) as (demo, backend):
        yield demo, backend, out


@pytest.fixture(scope="module")
def client(server):
    return Client(server[0].local_url, verbose=False)


def video(client: Client, **values):
    return client.predict(
        image=None, format=values.pop("format", "mp4"), prompt="a red circle moving left on a blue background", seed=3,
        **values, api_name="/video",
    )  # fmt: skip


def test_the_embedded_video_model_serves_the_video_tab_beside_the_image_models(server):
    _, backend, _ = server
    info = backend.model_info()
    assert info.model_name == "tiny-shapes" and info.video.model_name == "tiny-shapes-video"
    assert info.video.clips.default_frames == 17 and info.video.clips.image_to_video
    assert [r.role for r in backend.status()][-1] == "video"


def test_a_clip_through_the_api_plays_as_asked_and_keeps_its_parameters(client):
    played, files, info = video(client)
    clip = read_video(played)
    assert (clip.frames, clip.fps, clip.width, clip.height) == (17, 8.0, 64, 64)
    assert abs(clip.duration - 17 / 8) <= 0.05 * 17 / 8
    assert info["num_frames"] == [17] and info["seeds"] == [3]
    fields = read_png_info(played)["parameters"]
    assert fields["prompt"] == "a red circle moving left on a blue background" and fields["num_frames"] == 17
    assert any(f.endswith(".png") for f in files)  # the poster, for History
    decoded = read_frames(played)
    frames = np.stack([np.asarray(f, dtype=np.int16) for f in decoded])
    assert np.abs(np.diff(frames, axis=0)).mean() > 0.5  # a clip, not one picture repeated
    seen = score_clip(decoded, Ask("red", "circle", "blue", "left"))  # what the user asked to watch
    assert seen.direction_right and seen.color_right == seen.background_right == 17, seen
    assert seen.shape_right >= 15, seen  # a circle, redrawn by the model's refiner
    assert fields["extra"]["Video refiner"] == "tiny-shapes-motion" and fields["extra"]["Video refiner strength"] == "0.65"


def test_image_to_video_starts_from_the_given_frame(client, tmp_path):
    """The TI2V model keeps the given first frame (its latent frame stays the image's): the clip's first frame is
    the picture, through the VAE."""
    from models.train.video_world import Clip
    from models.train.world import Scene

    first = Clip(Scene("yellow", "square", "purple", 0.3, 0.5, 0.5, 0.0), "right").frame(0)
    path = tmp_path / "first.png"
    first.save(path)
    played, _, _ = client.predict(
        image=handle_file(str(path)), format="mp4", prompt="a yellow square moving right on a purple background", seed=1,
        api_name="/video",
    )  # fmt: skip
    frames = read_frames(played)
    assert len(frames) == 17
    given = np.asarray(first, dtype=np.int16)
    assert np.abs(np.asarray(frames[0], dtype=np.int16) - given).mean() < 12  # H.264 and the VAE's round trip
    assert score_clip(frames[:1], Ask("yellow", "square", "purple")).frame_share == 1.0


@pytest.mark.parametrize("fmt", ["webp", "gif", "png"])
def test_other_formats_on_request(client, fmt):
    played, files, _ = video(client, format=fmt, steps=4)
    assert played is None  # the player takes MP4 only
    clip = next(f for f in files if not f.endswith(".png"))
    assert read_video(clip).frames == 17 and read_video(clip).parameters.startswith("a red circle moving left")


def test_a_refused_video_request_names_the_field(client):
    with pytest.raises(Exception, match="num_frames: 10 is not k x 4 \\+ 1"):
        video(client, num_frames=10)


def test_video_model_none_serves_no_video(tmp_path):
    with running_app(DEFAULT_MODEL, tmp_path, env={"VIDEO_MODEL_ID": "none"}) as (_, backend):
        assert backend.model_info().video is None
        assert all(r.role != "video" for r in backend.status())
