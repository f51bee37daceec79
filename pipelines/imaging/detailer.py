"""The detailer pass (ADetailer's model of work): after the images are made, a detector finds regions in each,
and each region is inpainted at the model's full resolution with its own prompt, strength, dilation and
blur, in the same job (progress over all regions, previews, Stop between regions).

Detectors are transformers model folders in DETECTOR_DIR (nothing is downloaded; no ultralytics/YOLO,
which is AGPL): a semantic-segmentation model (SegFormer, UperNet, ...: every class but the first,
"background", is a region; connected parts apart, each with its mean probability as confidence), an
object detector (DETR, RT-DETR, YOLOS, ...: its boxes) or an instance-segmentation model (Mask2Former,
...: its masks). The embedded `shapes-segformer` (models/train/detector.py) finds the shapes world's
shapes, so the pass works offline and is testable.

A region's mask is dilated (or eroded) by `ad_dilate_erode` pixels, then inpainted as the Inpaint tab
does (pipelines.imaging.inpaint: mask blur inside the mask, "only masked" renders the region's box and
padding at the model's native area and pastes it back), with the image's own seed, steps, sampler,
guidance and LoRAs. Pixels outside the dilated masks are never changed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from devices.one_load import ONE_LOAD
from pipelines.schema.detailer import SECOND, Pass, model_defaults
from pipelines.schema.errors import OutOfMemoryError, UnsupportedTaskError
from pipelines.schema.fields import RequestError, shown
from pipelines.schema.inpaint import Inpaint
from pipelines.schema.regions import Regions, is_regional, layout, split_prompt

log = logging.getLogger(__name__)

PROMPT = "[PROMPT]"  # ADetailer's: the image's own prompt inside a detailer prompt


@dataclass(frozen=True)
class Region:
    """One detection: its mask (the image's size, 0/255) and how sure the detector is."""

    mask: Image.Image
    score: float

    @property
    def area(self) -> int:
        return int((np.asarray(self.mask) > 127).sum())


class Detectors:
    """The detector models under `folder`, loaded on first use on the manager's device (float32)."""

    def __init__(self, folder: Path | str | None, device_manager: Any) -> None:
        self.folder = Path(folder) if folder else None
        self.dm = device_manager
        self._loaded: dict[str, tuple[str, Any, Any]] = {}
        self._lock = threading.Lock()

    def names(self) -> tuple[str, ...]:
        if self.folder is None or not self.folder.is_dir():
            return ()
        return tuple(sorted(p.name for p in self.folder.iterdir() if (p / "config.json").is_file()))

    def check(self, name: str, field: str) -> None:
        if name not in self.names():
            offered = ", ".join(self.names()) or f"none (DETECTOR_DIR: {self.folder})"
            raise RequestError(field, f"no detector named {shown(name, 80)}; available: {offered}")

    def detect(self, name: str, image: Image.Image, confidence: float) -> list[Region]:
        """The regions `name` finds in `image` at least `confidence` sure, largest first."""
        kind, model, processor = self._model(name)
        image = image.convert("RGB")
        if kind == "semantic":
            found = _semantic(model, processor, image, self.dm.device)
        elif kind == "detection":
            found = _boxes(model, processor, image, confidence, self.dm.device)
        else:
            found = _instances(model, processor, image, confidence, self.dm.device)
        return sorted((r for r in found if r.score >= confidence), key=lambda r: -r.area)

    def _model(self, name: str) -> tuple[str, Any, Any]:
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = self._load(self.folder / name)  # type: ignore[operator]
            return self._loaded[name]

    def _load(self, path: Path) -> tuple[str, Any, Any]:
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        architecture = (config.architectures or [""])[0]
        kinds = {"SemanticSegmentation": ("semantic", transformers.AutoModelForSemanticSegmentation),
                 "ObjectDetection": ("detection", transformers.AutoModelForObjectDetection),
                 "UniversalSegmentation": ("instance", transformers.AutoModelForUniversalSegmentation),
                 "InstanceSegmentation": ("instance", transformers.AutoModelForInstanceSegmentation)}  # fmt: skip
        kind = next((v for k, v in kinds.items() if k in architecture), None)
        if kind is None:
            raise UnsupportedTaskError(
                f"{path.name}: {architecture or 'no architecture'} is not a detector (a transformers semantic-segmentation, "
                f"object-detection or instance-segmentation model)"
            )
        with ONE_LOAD:
            model = kind[1].from_pretrained(path).to(self.dm.device).eval()
            processor = transformers.AutoImageProcessor.from_pretrained(path)
        log.info("loaded detector %s (%s) on %s", path.name, architecture, self.dm.device)
        return kind[0], model, processor


def _semantic(model: Any, processor: Any, image: Image.Image, device: Any) -> list[Region]:
    """Every class but the first is a region; connected parts apart (thin slivers opened away), each scored by
    its mean probability."""
    import torch.nn.functional as F
    from scipy import ndimage

    logits = _forward(model, processor, image, device).logits
    probs = F.interpolate(logits.float(), size=(image.height, image.width), mode="bilinear", align_corners=False)
    foreground = (1 - probs.softmax(1)[0, 0]).cpu().numpy()
    # opened: a part thinner than 5 px (the blend where two regions' backgrounds meet) is not a region
    labels, count = ndimage.label(ndimage.binary_opening(foreground > 0.5, iterations=2))
    regions = []
    for index in range(1, count + 1):
        part = labels == index
        regions.append(Region(Image.fromarray((part * 255).astype(np.uint8)), float(foreground[part].mean())))
    return regions


def _forward(model: Any, processor: Any, image: Image.Image, device: Any) -> Any:
    """The detector's raw outputs for `image`, through its own image processor."""
    import torch

    inputs = processor(images=image, return_tensors="pt").to(device)
    with torch.no_grad():
        return model(**inputs)


def _boxes(model: Any, processor: Any, image: Image.Image, confidence: float, device: Any) -> list[Region]:
    outputs = _forward(model, processor, image, device)
    found = processor.post_process_object_detection(outputs, threshold=confidence, target_sizes=[(image.height, image.width)])[0]
    regions = []
    for score, box in zip(found["scores"].tolist(), found["boxes"].tolist(), strict=True):
        mask = np.zeros((image.height, image.width), np.uint8)
        x0, y0, x1, y1 = (round(v) for v in box)
        mask[max(0, y0) : max(0, y1), max(0, x0) : max(0, x1)] = 255
        regions.append(Region(Image.fromarray(mask), float(score)))
    return regions


def _instances(model: Any, processor: Any, image: Image.Image, confidence: float, device: Any) -> list[Region]:
    outputs = _forward(model, processor, image, device)
    found = processor.post_process_instance_segmentation(outputs, threshold=confidence, target_sizes=[(image.height, image.width)])[0]
    segmentation = found["segmentation"].cpu().numpy()
    return [
        Region(Image.fromarray(((segmentation == info["id"]) * 255).astype(np.uint8)), float(info["score"]))
        for info in found["segments_info"]
    ]


def dilated(mask: Image.Image, pixels: int) -> Image.Image:
    """`mask` grown by `pixels` (a negative count shrinks it), ADetailer's dilate/erode, with a square kernel."""
    if pixels == 0:
        return mask
    import cv2

    kernel = np.ones((2 * abs(pixels) + 1, 2 * abs(pixels) + 1), np.uint8)
    op = cv2.dilate if pixels > 0 else cv2.erode
    return Image.fromarray(op(np.asarray(mask), kernel))


def passes(request: Any, vocabulary: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The request's detailer passes that run, as plain values (ad_model, ad_prompt, ...), in order, the
    model's defaults (`vocabulary`) in place of those left null."""
    defaults = model_defaults(vocabulary or {})
    found = [part.plain() for part in (request.detailer, request.detailer_2nd) if isinstance(part, Pass) and part.on]
    return [{**values, **{k: v for k, v in defaults.items() if values.get(k) is None}} for values in found]


def region_prompt(text: str | None, own: str) -> str:
    """A pass's prompt for an image: its own where empty, ADetailer's [PROMPT] replaced by the image's."""
    if not text or not text.strip():
        return own
    return text.replace(PROMPT, own)


def _own_prompt(request: Any, prompt: str, mask: Image.Image) -> str:
    """The image's prompt for a region: with regional prompts, the text of the region holding the detection's
    centre (and the base prompt before it), not the whole regional prompt."""
    spec = request.regions
    if spec is None or not spec.regional_prompts or (not is_regional(prompt) and "BREAK" not in prompt):
        return prompt
    split = split_prompt(prompt)
    ys, xs = np.nonzero(np.asarray(mask) > 127)
    x, y = (xs.mean() + 0.5) / mask.width, (ys.mean() + 0.5) / mask.height
    try:
        boxes = layout(spec.region_ratios, len(split.regions), spec.region_split)
    except ValueError:
        return split.regions[0]
    text = next((t for t, b in zip(split.regions, boxes, strict=True) if b.left <= x < b.right and b.top <= y < b.bottom), split.regions[0])
    return f"{split.base}, {text}" if split.base else text


def region_request(request: Any, values: dict[str, Any], image: Image.Image, mask: Image.Image, meta: dict[str, Any]) -> Any:
    """The inpaint of one region: the image's prompt, seed, steps, sampler and guidance; the pass's prompt,
    strength, blur and area."""
    inpaint = Inpaint(
        mask=mask,
        mask_blur=values["ad_mask_blur"],
        inpaint_area="only masked" if values["ad_inpaint_only_masked"] else "whole picture",
        padding=values["ad_inpaint_only_masked_padding"],
    )
    return request.replace(
        prompt=region_prompt(values["ad_prompt"], _own_prompt(request, meta["prompt"], mask)),
        negative_prompt=region_prompt(values["ad_negative_prompt"], request.negative_prompt or "") or None,
        init_images=[image], inpaint=inpaint, strength=values["ad_denoising_strength"], seed=meta["seed"],
        num_images=1, width=None, height=None, hires=None, regions=Regions(), detailer=None, detailer_2nd=None,
        controlnet=(), ip_adapter=(), prompt_template=(), wildcards="off",
    )  # fmt: skip


def run(p: Any, request: Any, result: Any, progress: Any, should_cancel: Any, preview: Any) -> Any:
    """The request's detailer passes over `result`'s images (`ImagePipeline.generate`, under its lock, the
    sampler already swapped): each pass detects in every image first, so the progress bar counts all its
    regions; each region is one inpaint; Stop between (or during) regions returns what finished."""
    start = time.perf_counter()
    said: list[str] = []
    for number, values in enumerate(passes(request, p.vocabulary)):
        if result.cancelled or (should_cancel is not None and should_cancel()):
            result.cancelled = True
            break
        try:
            _one_pass(p, request, result, values, "" if number == 0 else SECOND, progress, should_cancel, preview, said)
        except (UnsupportedTaskError, OutOfMemoryError, OSError) as exc:  # the images drawn so far are kept, as ADetailer does
            log.warning("detailer pass %d (%s) failed: %s", number + 1, values["ad_model"], exc)
            result.warnings.append(f"detailer {values['ad_model']}: {exc}; the images are as the passes before left them")
    seconds = time.perf_counter() - start
    result.timings["detailer"] = seconds
    result.timings["total"] = result.timings.get("total", 0.0) + seconds
    result.detailer = "; ".join(said)
    return result


def _one_pass(p: Any, request: Any, result: Any, values: dict[str, Any], suffix: str, progress: Any,
              should_cancel: Any, preview: Any, said: list[str]) -> None:  # fmt: skip
    p.activity = f"{len(result.images)} image(s), detecting with {values['ad_model']}"
    found = [p.detectors.detect(values["ad_model"], image, values["ad_confidence"]) for image in result.images]
    if values["ad_mask_k_largest"]:
        found = [regions[: values["ad_mask_k_largest"]] for regions in found]
    steps = max(1, int(request.steps * values["ad_denoising_strength"]))
    total = max(1, sum(map(len, found)) * steps)
    done = 0
    stopped = "stopped during the detailer pass: the regions not yet repainted are as drawn"
    for index, regions in enumerate(found):
        for number, region in enumerate(regions):
            if should_cancel is not None and should_cancel():
                result.cancelled = True
                result.warnings.append(stopped)
                return
            mask = dilated(region.mask, values["ad_dilate_erode"])
            if mask.getbbox() is None:  # eroded away: nothing to repaint
                continue
            sub = region_request(request, values, result.images[index], mask, result.metadata[index])

            def report(step: int, _total: int, _image: int, base: int = done, image: int = index) -> None:
                if progress is not None:
                    progress(base + step, total, image)

            p.activity = f"detailer: image {index + 1}, region {number + 1}/{len(regions)}"
            out = p._generate(sub, report, should_cancel, None, preview)
            if out.cancelled or not out.images:  # Stop during the region: it is dropped, half-denoised
                result.cancelled = True
                result.warnings.append(stopped)
                return
            result.images[index] = out.images[0]
            done += steps
        result.metadata[index].update({name + suffix: value for name, value in values.items() if value is not None})
    count = sum(map(len, found))
    said.append(f"{values['ad_model']}: {count} region(s) in {sum(1 for r in found if r)} of {len(found)} image(s)")
    if not count:
        result.warnings.append(f"detailer: {values['ad_model']} found nothing at confidence {values['ad_confidence']:g}")
