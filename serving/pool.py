"""DevicePool: one ImagePipeline replica per device of this machine, behind the GenerationBackend interface.

- Devices: `PREFERRED_DEVICE=cuda:0,cuda:1 | npu:all | all | cpu,cpu` or `CPU_REPLICAS=N`
  (devices.pool.devices_for). Weights are read from disk once; each further replica is a copy
  of that CPU copy moved to its device, so the disk is read once and no device ever holds two.
- Scheduling: a request takes the replicas that are free when it starts (waiting on a condition
  for one to free up, never polling). A request of several images is split over them by
  contiguous work-item ranges (`ImagePipeline.generate(item_range=...)`), run in threads and merged
  in order: image i keeps the seed `seed + i`, so the result is the one a single device gives.
  The Gradio queue runs as many requests at once as there are healthy replicas.
- Health: a replica that fails with anything but a request error (ValueError, PipelineError) is
  judged by the device self-test and, when retired, re-tested in the background until it passes
  (serving/health.py: the rules and why); its part of the work is retried once on a healthy
  replica. Out-of-memory is not a device failure: it is passed on with what finished.
- Parallel groups (PARALLEL, serving/parallel.py) are replicas too: a group of devices splits each image
  (context or tensor parallel), and the pool spreads requests over groups as over devices.
- CPU replicas share the cores: torch's threads are divided between them (process-wide setting).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from devices import DeviceManager
from devices.options import DeviceOptions, DeviceSettings
from devices.pool import cpu_threads_each, devices_for
from pipelines import (
    CancelFn,
    Capabilities,
    ImagePipeline,
    ModelInfo,
    PipelineOptions,
    PreviewFn,
    ProgressFn,
    ReplicaStatus,
    open_model,
    quantization_applied,
    report_progress,
)
from pipelines.schema.errors import ModelLoadError, OutOfMemoryError, PipelineError
from pipelines.schema.request import GenerationRequest, GenerationResult, pin_seed, validate
from serving.health import ProbeFn, Retest, device_probe, run_probe

log = logging.getLogger(__name__)

# how a pool makes its replicas of a model: (source, device managers, options) -> replicas
Builder = Callable[[str, list[DeviceManager], PipelineOptions], list[Any]]


class _Replica:
    def __init__(self, name: str, pipeline: ImagePipeline):
        self.name = name
        self.pipeline = pipeline
        self.healthy = True
        self.error: str | None = None  # why it was retired, and how its re-tests went
        self.busy = False
        self.retirements = 0  # a re-test thread serves one retirement: a later one starts its own


class DevicePool:
    """Replicas of one model, one per device; `generate` spreads a request over the free ones."""

    def __init__(
        self,
        pipelines: list[ImagePipeline],
        probe: ProbeFn = device_probe,
        retest: Retest | None = None,
        builder: Builder | None = None,
    ):
        """`probe`: the health test of a replica (the device self-test); `retest`: when a retired
        replica is tested again (serving/health.py); `builder`: how a model switch makes the replicas
        again (default: one ImagePipeline per device; a pool of parallel groups starts groups,
        serving/parallel.py)."""
        if not pipelines:
            raise ValueError("a device pool needs at least one replica")
        counts: dict[str, int] = {}
        self._replicas = []
        for p in pipelines:
            base = p.status()[0].name  # the device ("cuda:0", "cpu"), or a parallel group's name
            n = counts[base] = counts.get(base, -1) + 1
            self._replicas.append(_Replica(f"{base}#{n}" if base == "cpu" else base, p))
        self._changed = threading.Condition()
        self._switching = threading.Lock()
        self._judging = threading.Lock()  # one failure judged at a time: "the last healthy one" stays true
        self._closed = threading.Event()  # stops the re-tests
        self._probe, self._retest = probe, retest or Retest()
        self._build = builder or _build

    # ---------------------------------------------------------------- building
    @classmethod
    def from_pretrained(
        cls,
        source: str | None = None,
        devices: str | None = None,
        options: PipelineOptions | None = None,
        device_settings: DeviceSettings | None = None,
        **overrides: Any,
    ) -> DevicePool:
        """Load `source` once and place one replica on each device of `devices` (default: the settings'
        PREFERRED_DEVICE). Nothing is read from the environment: the app passes its settings objects."""
        settings = device_settings or DeviceSettings()
        targets = devices_for(devices if devices is not None else settings.preferred, settings.cpu_replicas)
        managers = [DeviceManager(options=DeviceOptions.for_device(d, settings)) for d in targets]
        share_cpu_threads(managers)
        opts = (options or PipelineOptions()).updated(**overrides)
        return cls(_build(str(source or opts.model_id), managers, opts))

    # ---------------------------------------------------------------- GenerationBackend
    capabilities = Capabilities(previews=True, switch_models=True, count_tokens=True)

    @property
    def concurrency(self) -> int:
        return max(1, sum(r.healthy for r in self._replicas))

    def model_info(self) -> ModelInfo:
        return self._replicas[0].pipeline.model_info()

    def count_tokens(self, prompt: str) -> list:
        """The token counter (every replica runs the same model)."""
        return self._replicas[0].pipeline.count_tokens(prompt)

    def status(self) -> list[ReplicaStatus]:
        rows = []
        for r in self._replicas:
            row = r.pipeline.status()[0]
            # a replica's own trouble (a parallel group restarting) shows beside the pool's judgement
            rows.append(dataclasses.replace(row, name=r.name, healthy=r.healthy and row.healthy,
                                            error=r.error or row.error, busy=r.busy))  # fmt: skip
        return rows

    def close(self) -> None:
        self._closed.set()
        for r in self._replicas:
            r.pipeline.close()

    @property
    def replicas(self) -> list[ImagePipeline]:
        return [r.pipeline for r in self._replicas]

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
    ) -> GenerationResult:
        """Validate, take the free replicas, split by work item, merge in order."""
        validate(request, self._replicas[0].pipeline.limits)  # the whole request: parts check only their range
        request = pin_seed(request)  # one seed for every part
        total = request.total_images
        taken = self._acquire(total)
        ranges = split_range(total, len(taken))
        run = _Run(request, progress, should_cancel, preview, len(ranges))
        threads = [
            threading.Thread(target=self._part, args=(run, i, replica, rng), name=f"pool-{replica.name}")
            for i, (replica, rng) in enumerate(zip(taken, ranges, strict=True))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return run.merged()

    def load_model(self, model_id: str, progress: Callable[[float, str], None] | None = None) -> ModelInfo:
        """Switch every replica to `model_id`: wait for running work, free the old weights, load the new.

        The old model is released before the new one loads (a device rarely holds two large
        models). If the new one fails to load, the old one is loaded again and serves, and
        ModelLoadError says why the switch failed.
        """
        say = progress or (lambda _f, _m: None)
        with self._switching:
            say(0.05, "waiting for running work")
            taken = self._acquire_all()
            try:
                first = taken[0].pipeline
                managers, options, old = [r.pipeline.dm for r in taken], first.options, first.model_id
                say(0.2, f"unloading {first.model_name}")
                self._unload()
                say(0.4, f"loading {model_id}")
                try:
                    pipelines = self._build(model_id, managers, options)
                except Exception as exc:
                    log.error("switch to %s failed (%s); reloading %s", model_id, exc, old)
                    self._install(self._build(old, managers, options))
                    raise ModelLoadError(f"could not switch to {model_id}: {exc}; {old} is serving again") from exc
                self._install(pipelines)
                say(1.0, "ready")
                return self.model_info()
            finally:
                self._release(self._replicas)

    def _acquire_all(self) -> list[_Replica]:
        """Every replica, once none is busy (new requests wait behind the switch)."""
        with self._changed:
            while any(r.busy for r in self._replicas):
                self._changed.wait()
            for r in self._replicas:
                r.busy = True
            return list(self._replicas)

    def _unload(self) -> None:
        for r in self._replicas:
            r.pipeline.close()
        gc.collect()  # diffusers pipelines hold reference cycles: free their tensors now, not later
        for r in self._replicas:
            r.pipeline.dm.empty_cache()

    def _install(self, pipelines: list[ImagePipeline]) -> None:
        with self._changed:
            for replica, pipeline in zip(self._replicas, pipelines, strict=True):
                replica.pipeline, replica.healthy, replica.error = pipeline, True, None
                replica.busy = True  # released by load_model's finally

    # ---------------------------------------------------------------- internals
    def _acquire(self, wanted: int) -> list[_Replica]:
        """Block until at least one healthy replica is free; take up to `wanted` of them."""
        with self._changed:
            while True:
                healthy = [r for r in self._replicas if r.healthy]
                if not healthy:
                    raise PipelineError("no healthy device is left: " + "; ".join(self._errors()))
                free = [r for r in healthy if not r.busy]
                if free:
                    taken = free[:wanted]
                    for r in taken:
                        r.busy = True
                    return taken
                self._changed.wait()

    def _release(self, replicas: list[_Replica]) -> None:
        with self._changed:
            for r in replicas:
                r.busy = False
            self._changed.notify_all()

    def _errors(self) -> list[str]:
        return [f"{r.name}: {r.error}" for r in self._replicas if r.error]

    def _part(self, run: _Run, index: int, replica: _Replica, item_range: tuple[int, int]) -> None:
        """Run one part; on a device failure mark the replica and retry the part once elsewhere.

        Each part gives its replica back as soon as it is done with it, so a retry can use a
        replica that another part of the same request has just finished with.
        """
        try:
            run.results[index] = run.call(replica.pipeline, index, item_range)
            return
        except (ValueError, PipelineError) as exc:  # the request's fault (or out of memory): not the device's
            run.errors[index] = exc
            return
        except Exception as exc:
            self._device_failed(replica, exc)
        finally:
            self._release([replica])
        try:
            spare = self._acquire(1)[0]
        except PipelineError as exc:
            run.errors[index] = exc
            return
        try:
            run.results[index] = run.call(spare.pipeline, index, item_range)
        except (ValueError, PipelineError) as exc:
            run.errors[index] = exc
        except Exception as exc:
            self._device_failed(spare, exc)
            run.errors[index] = PipelineError(f"generation failed on {replica.name} and again on {spare.name}: {exc}")
        finally:
            self._release([spare])

    # ---------------------------------------------------------------- health (serving/health.py)
    def wait_healthy(self, timeout: float) -> bool:
        """Block until every replica is healthy again (or `timeout` seconds); whether they are."""
        with self._changed:
            return self._changed.wait_for(lambda: all(r.healthy for r in self._replicas), timeout)

    def _device_failed(self, replica: _Replica, exc: Exception) -> None:
        """A failure that is not the request's. The last healthy replica is probed first and kept
        when its device passes; any other is retired and re-tested in the background."""
        log.error("replica %s failed: %s", replica.name, exc, exc_info=exc)
        reason = f"{type(exc).__name__}: {exc}"
        with self._judging:
            with self._changed:
                last = replica.healthy and not any(r.healthy for r in self._replicas if r is not replica)
            if last:
                ok, detail = run_probe(self._probe, replica.pipeline, replica.name)
                if ok:
                    log.warning("replica %s kept: the last healthy one, and its self-test passed", replica.name)
                    return
                reason += f"; self-test failed: {detail}"
            with self._changed:
                replica.healthy, replica.error = False, f"{reason}; re-test in {self._retest.delay(0):g} s"
                replica.retirements += 1
                self._changed.notify_all()
        args = (replica, reason, replica.retirements)
        threading.Thread(target=self._recover, args=args, name=f"retest-{replica.name}", daemon=True).start()

    def _recover(self, replica: _Replica, reason: str, retirement: int) -> None:
        """Re-test a retired replica with back-off until it passes, the pool closes, or a model
        switch makes it healthy (or retires it again: that retirement's thread goes on); it holds
        the replica (busy) while testing."""
        failed = 0
        while not self._closed.wait(self._retest.delay(failed)):
            with self._changed:
                self._changed.wait_for(lambda: not replica.busy)
                if replica.healthy or replica.retirements != retirement:
                    return
                replica.busy = True
            ok, detail = run_probe(self._probe, replica.pipeline, replica.name)
            with self._changed:
                replica.busy = False
                if ok:
                    replica.healthy, replica.error = True, None
                    log.warning("replica %s is back: its self-test passed after %s", replica.name, reason)
                else:
                    failed += 1
                    replica.error = (
                        f"{reason}; re-test {failed} failed ({detail}); next in {self._retest.delay(failed):g} s"
                    )
                self._changed.notify_all()
            if ok:
                return


class _Run:
    """One request split into parts: merged progress, per-part results, the merged result."""

    def __init__(self, request, progress, should_cancel, preview, parts: int):
        self.request, self.progress, self.should_cancel, self.preview = request, progress, should_cancel, preview
        self.results: list[GenerationResult | None] = [None] * parts
        self.errors: list[BaseException | None] = [None] * parts
        self._steps = [(0, 1)] * parts
        self._lock = threading.Lock()

    def call(self, pipeline: ImagePipeline, index: int, item_range: tuple[int, int]) -> GenerationResult:
        def report(step: int, total: int, image: int, note: str = "") -> None:
            with self._lock:
                self._steps[index] = (step, total)
                done, whole = sum(s for s, _ in self._steps), sum(t for _, t in self._steps)
            if self.progress is not None:
                report_progress(self.progress, done, whole, image, note)

        extra = {"preview": self.preview} if self.preview is not None else {}
        return pipeline.generate(self.request, report, self.should_cancel, item_range=item_range, **extra)

    def merged(self) -> GenerationResult:
        """All parts in order; the first error is raised, with the parts before it as `partial` if OOM."""
        done = []
        for result, error in zip(self.results, self.errors, strict=True):
            if error is not None:
                if isinstance(error, OutOfMemoryError):
                    partial = merge_results([*done, *([error.partial] if error.partial else [])])
                    raise OutOfMemoryError(str(error), partial) from error
                raise error
            done.append(result)
        return merge_results(done)


def split_range(total: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ranges covering 0..total, as equal as possible, no empty one."""
    parts = max(1, min(parts, total))
    size, extra = divmod(total, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def merge_results(results: list[GenerationResult]) -> GenerationResult:
    """One result from parts run side by side: lists concatenated in order, wall time = the longest part."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    timings = {k: max(r.timings.get(k, 0.0) for r in results) for k in ("encode", "denoise", "decode", "total")}
    timings["steps_per_second"] = sum(r.timings.get("steps_per_second", 0.0) for r in results)
    warnings = list(dict.fromkeys(w for r in results for w in r.warnings))
    peaks = [r.peak_memory for r in results if r.peak_memory is not None]
    return GenerationResult(
        images=[im for r in results for im in r.images],
        seeds=[s for r in results for s in r.seeds],
        metadata=[m for r in results for m in r.metadata],
        timings=timings,
        peak_memory=max(peaks) if peaks else None,
        device=", ".join(dict.fromkeys(r.device for r in results)),
        dtype=first.dtype,
        attention=first.attention,
        warnings=warnings,
        cancelled=any(r.cancelled for r in results),
        inputs=[i for r in results for i in r.inputs],
        attention_components=first.attention_components,
    )


def _replica_copy(loaded: Any, source: str, dm: DeviceManager, opts: PipelineOptions) -> Any:
    """A replica's own diffusers pipeline: a deep copy of the one read (on the CPU, read once), or for a
    quantized model the model opened again (diffusers 0.42's GGUF parameters cannot be deep-copied)."""
    if not quantization_applied(loaded):
        return copy.deepcopy(loaded)
    return open_model(source, dm, opts)[0]


def _build(source: str, managers: list[DeviceManager], opts: PipelineOptions) -> list[ImagePipeline]:
    """One replica of `source` per manager: read from disk once, then copied per device."""
    start = time.perf_counter()
    if len(managers) == 1:
        pipeline = ImagePipeline.from_pretrained(source, managers[0], opts)
        pipeline.model_id = source
        return [pipeline]
    loaded, recipe, weights = open_model(source, managers[0], opts)
    replicas = [
        ImagePipeline.from_loaded(_replica_copy(loaded, source, dm, opts), dm, opts, weights, start, recipe)
        for dm in managers[1:]
    ]
    replicas.insert(0, ImagePipeline.from_loaded(loaded, managers[0], opts, weights, start, recipe))
    for r in replicas:
        r.model_id = source
    log.info("device pool: %d replicas of %s in %.2f s", len(replicas), source, time.perf_counter() - start)
    return replicas


def share_cpu_threads(managers: list[DeviceManager]) -> None:
    """CPU replicas divide the cores: torch's intra-op threads per replica = cores // replicas."""
    cpu = sum(dm.backend == "cpu" for dm in managers)
    if cpu > 1:
        threads = cpu_threads_each(cpu)
        torch.set_num_threads(threads)
        log.info("%d CPU replicas: %d torch thread(s) each", cpu, threads)
