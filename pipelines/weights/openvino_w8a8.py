"""OPENVINO_WEIGHTS=w8a8: the denoiser's weights *and* activations in int8 (NNCF post-training quantization).

Why (issue 58, docs/performance.md#int8-weights): int8 *weights* alone (`nncf.compress_weights`) are decompressed
to f32 before each layer, so a compute-bound network such as a diffusion UNet on a CPU saves memory but not time
(1.0-1.1x measured). Quantizing the activations too lets the CPU's int8 instructions (AVX-512 VNNI, AMX) do the
convolutions and matrix products: the embedded UNet's graph ran 1.8-2.0x faster on this VM's VNNI CPU.

Activation ranges need calibration data: the denoiser's real inputs, which only a generation makes. So the first
request runs the f32 graph while `Calibration` records its first CALIBRATION_CALLS calls (one request of 20
steps: every noise level), then the graph is quantized (a few seconds, once), checked against the f32 graph on
those inputs and saved in the graph cache; later requests, and restarts, run the int8 graph. The text encoders
and the VAE get int8 weights (as OPENVINO_WEIGHTS=int8): their share of a request is small and the VAE's
decoder is where int8 activations cost the most PSNR.

The settings, tried on the embedded model (20 steps, same seeds, images against torch fp32's): NNCF's transformer
defaults gave a median 34 dB with 13 of 40 scenes under 30 dB; SmoothQuant off, the MIXED preset (asymmetric
activations) and the first and last convolutions and the time/text embeddings kept in f32 gave a median 39-40 dB,
with 6 of 120 scenes still under 30 dB (the same shape and colours, drawn a few pixels apart). Those drifts came
from the activation ranges: NNCF's default for activations is the mean over the calibration calls of each call's
min and max (MEAN_MINMAX), and a denoiser's activations span very different ranges over the noise levels, so every
call beyond the mean range was clipped, the same way on every request, a systematic error the sampler carries
(random noise of 2% of the output on every call moved no image below 53 dB). The full range over all the calls
(MINMAX) gives a median 45 dB with none of 120 scenes under 30 dB (lowest 32 dB) at the same speed.
Calibrating on one request or on sixteen made no difference.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np

# In the graphs' key (OpenVinoRuntime.identity): a new recipe quantizes again instead of reading an older one's graph.
RECIPE = {"w8a8": "w8a8 (activations: MINMAX)"}
CALIBRATION_CALLS = 20  # the first request's denoiser calls (20 steps); NNCF's own default subset is 300
KEEP_F32 = re.compile(r"conv_in|conv_out|time_embedding|add_embedding|time_text_embed|x_embedder|proj_out")
# The largest mean |int8 - f32| / mean |f32| of the denoiser's output on its calibration inputs accepted (measured
# on the embedded UNet: ~0.02); above it the f32 graph is kept, and the status panel says why.
TOLERANCE = 0.1


class Calibration:
    """The denoiser's inputs recorded from its first calls, until there are enough to quantize on."""

    def __init__(self, calls: int = CALIBRATION_CALLS):
        self.calls = calls
        self.samples: list[list[np.ndarray]] = []

    def record(self, arrays: list[np.ndarray]) -> bool:
        """Keep one call's inputs; True when there are enough."""
        self.samples.append([a.copy() for a in arrays])
        return len(self.samples) >= self.calls

    def describe(self) -> str:
        return f"calibrating int8 activations ({len(self.samples)}/{self.calls} calls)"


def quantize(model: Any, samples: list[list[np.ndarray]]) -> Any:
    """The f32 OpenVINO model with int8 weights and activations, calibrated on `samples`."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    nncf.set_log_level(logging.WARNING)  # NNCF logs every layer it leaves out at INFO
    keep = [op.get_friendly_name() for op in model.get_ordered_ops() if op.get_type_name() in ("Convolution", "MatMul")]
    keep = [name for name in keep if KEEP_F32.search(name)]
    return nncf.quantize(
        model,
        nncf.Dataset(samples),
        subset_size=len(samples),
        preset=nncf.QuantizationPreset.MIXED,
        model_type=nncf.ModelType.TRANSFORMER,
        ignored_scope=nncf.IgnoredScope(names=keep, validate=False),
        advanced_parameters=AdvancedQuantizationParameters(
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1),
            # every activation's range over all the calls, not NNCF's mean of each call's (MEAN_MINMAX): a range
            # averaged over the noise levels clips the calls beyond it, the same way on every request (module doc)
            activations_range_estimator_params=RangeEstimatorParametersSet.MINMAX,
        ),
    )


def relative_error(int8_for: Callable[[list[np.ndarray]], Any], f32_for: Callable[[list[np.ndarray]], Any],
                   samples: list[list[np.ndarray]]) -> float:
    """mean |int8 - f32| / mean |f32| of the first output, over every few calibration calls; `int8_for` and
    `f32_for` give each call's compiled graph (per its shapes, where graphs are static)."""
    diff = scale = 0.0
    for arrays in samples[:: max(1, len(samples) // 5)]:
        got, want = (compiled(arrays).create_infer_request() for compiled in (int8_for, f32_for))
        got.infer(arrays)
        want.infer(arrays)
        a, b = got.get_output_tensor(0).data, want.get_output_tensor(0).data
        diff += float(np.abs(a - b).mean())
        scale += float(np.abs(b).mean())
    return diff / max(scale, 1e-12)
