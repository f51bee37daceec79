"""The engine below every front end: settings, the backend built from them, and jobs.

The Gradio UI and API (`ui/`), the command line, the benchmarks, the Space and the HTTP APIs all
build the backend with `build_backend(settings)` and run requests through one `Engine`, so they
share its limits, progress, previews and Stop. Nothing here imports gradio or `ui`.
"""

from .backends import build_backend, build_engine
from .jobs import (
    Admission,
    Caller,
    CancelledBeforeStart,
    Engine,
    Finished,
    Job,
    Preview,
    Progress,
    Queued,
    QueueFull,
    Refused,
    Switching,
    TooManyJobs,
)
from .settings import AppSettings, SettingsError

__all__ = [
    "Admission",
    "AppSettings",
    "Caller",
    "CancelledBeforeStart",
    "Engine",
    "Finished",
    "Job",
    "Preview",
    "Progress",
    "QueueFull",
    "Queued",
    "Refused",
    "SettingsError",
    "Switching",
    "TooManyJobs",
    "build_backend",
    "build_engine",
]
