"""Video: video models' abilities, and clips written and read as files (H.264 MP4, animated WebP or GIF, PNG frames in a zip).

Owns:
- what a video pipeline can do, read from it: frames and their step, fps, image-to-video twins, a second
  expert; a video request's call arguments (`family`);
- the frame-packed VAE: an image VAE laid out as Wan's video VAE, under the embedded video model (`packed_vae`);
- a video request's peak memory, estimated from the loaded model's configs, and what would fit when it does not
  (`memory`; the refusal runs in pipelines.run.checks);
- writing a clip's frames with its parameters and metadata, and reading a clip back: its frame
  count, rate, duration, size, parameters and frames (`files`).
Importing the package loads nothing; `files` is torch-free and loads PyAV only when an MP4 is written or read.

May import: schema, sampling (the room sits beside control, imaging and weights).
"""
