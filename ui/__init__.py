"""The Gradio UI of Diffusion Anywhere, in one-job files: settings, output storage, input parsing, jobs.

`app.py` assembles them with `create_demo(...)`. Nothing here loads a model or probes a device at
import time, and nothing here reaches into a pipeline: the UI talks to one `GenerationBackend`.
"""
