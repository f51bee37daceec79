"""The "Device & memory" panel: one row per device/replica, and a memory-over-time plot."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import pandas as pd

from devices.memory import human_bytes
from pipelines import ReplicaStatus


@dataclass
class MemoryHistory:
    """Last few minutes of memory samples per replica for the plot (one sample per second at most)."""

    seconds: int = 300
    samples: deque = field(default_factory=lambda: deque(maxlen=600))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, replicas: list[ReplicaStatus]) -> pd.DataFrame:
        now = time.time()
        with self.lock:
            if not self.samples or now - self.samples[-1][0] >= 1.0:
                self.samples.append((now, [(r.name, r.backend, dict(r.memory)) for r in replicas]))
            rows = []
            for t, entries in self.samples:
                if now - t > self.seconds:
                    continue
                age = round(t - now, 1)
                for name, backend, memory in entries:
                    if backend != "cpu" and memory.get("allocated") is not None:
                        rows.append({"seconds": age, "MiB": memory["allocated"] / 2**20, "memory": f"{name} allocated"})
                    if memory.get("host_rss") is not None:
                        rows.append({"seconds": age, "MiB": memory["host_rss"] / 2**20, "memory": f"{name} RSS"})
        return pd.DataFrame(rows, columns=["seconds", "MiB", "memory"]).drop_duplicates(["seconds", "MiB"])


def _memory_cell(r: ReplicaStatus, zero_gpu: bool) -> str:
    m, h = r.memory, human_bytes
    if zero_gpu:
        return "allocated per call (ZeroGPU)"
    if r.backend == "cpu":
        return f"{h(m.get('allocated'))} (peak {h(m.get('peak'))})"
    return f"{h(m.get('allocated'))} (peak {h(m.get('peak'))}, free {h(m.get('free'))} of {h(m.get('total'))})"


def status_markdown(replicas: list[ReplicaStatus], warnings: list[str], zero_gpu: bool = False, queue: str = "") -> str:
    """A table with one row per replica: device (its dtype and attention under it), memory, what it does now;
    the queue. Three columns, so that each keeps whole words in the side panel's width."""
    lines = ["| device | memory | now |", "|---|---|---|"]
    for r in replicas:
        state = r.activity if r.healthy else f"⛔ out of service: {r.error}"
        lines.append(
            f"| **{r.name}** {r.device_name}<br><small>{r.dtype} · {r.attention}</small> | {_memory_cell(r, zero_gpu)} | {state} |"
        )
    host = replicas[0].memory if replicas else {}
    parts = replicas[0].attention_components if replicas else {}
    if parts:
        lines += ["", "<small>attention by component: " + " · ".join(f"{k} {v}" for k, v in parts.items()) + "</small>"]
    if replicas:
        quantized = "".join(f" · {c} {what}" for c, what in replicas[0].quantization.items())
        lines += ["", f"<small>weights: {replicas[0].weights}{quantized} · {replicas[0].compile}</small>"]
        lines += ["", f"<small>runtime: {replicas[0].runtime} · VAE: {replicas[0].vae}</small>"]
    if host.get("host_total"):
        lines += ["", f"host RAM {human_bytes(host.get('host_available'))} free of {human_bytes(host['host_total'])}"]
    if queue:
        lines += ["", queue]
    lines += [f"\n⚠️ {w}" for w in warnings]
    lines += ["", f"<small>live · updated {time.strftime('%H:%M:%S')}</small>"]
    return "\n".join(lines)


def status_json(replicas: list[ReplicaStatus]) -> dict[str, Any]:
    """`/status`: the first replica's memory figures at the top level (as before), plus every replica."""
    first = replicas[0] if replicas else None
    top: dict[str, Any] = dict(first.memory) if first else {}
    if first is not None:
        top.update(
            device=first.device,
            dtype=first.dtype,
            attention=first.attention,
            attention_components=first.attention_components,
            weights=first.weights,
            compile=first.compile,
            runtime=first.runtime,
            vae=first.vae,
        )
    top["replicas"] = [r.to_dict() for r in replicas]
    top["healthy_replicas"] = sum(r.healthy for r in replicas)
    return top


def panel() -> tuple[gr.Markdown, gr.LinePlot]:
    gr.Markdown("### Device & memory")
    status_md = gr.Markdown(elem_id="status")
    plot = gr.LinePlot(
        x="seconds", y="MiB", color="memory", height=220, x_title="seconds ago", y_title="MiB",
        label="Memory, last minutes", elem_id="memory-plot",
    )  # fmt: skip
    return status_md, plot
