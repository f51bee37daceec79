"""AUTOMATIC1111's reading of an infotext, reimplemented for the round-trip test (not vendored).

Follows stable-diffusion-webui v1.10 (AGPL-3.0; this is a re-statement of its logic, not a copy):
modules/infotext_utils.py `parse_generation_parameters` (re_param_code, unquote, the prompt /
"Negative prompt:" split, "Size-1"/"Size-2", the defaults it fills in: "Schedule type: Automatic",
"Clip skip: 1", "RNG: GPU") and modules/sd_samplers.py `get_sampler_and_scheduler` (a schedule label
at the end of the sampler name is split off; a schedule equal to the sampler's own default becomes
"Automatic"), with the sampler and schedule tables of modules/sd_samplers_kdiffusion.py,
sd_samplers_timesteps.py, sd_samplers_lcm.py and modules/sd_schedulers.py.
"""

from __future__ import annotations

import json
import re

re_param_code = r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)'
re_param = re.compile(re_param_code)
re_imagesize = re.compile(r"^(\d+)x(\d+)$")

# sd_schedulers.schedulers: (name, label, aliases)
SCHEDULERS = [
    ("automatic", "Automatic", []), ("uniform", "Uniform", []), ("karras", "Karras", []),
    ("exponential", "Exponential", []), ("polyexponential", "Polyexponential", []),
    ("sgm_uniform", "SGM Uniform", ["SGMUniform"]), ("kl_optimal", "KL Optimal", []),
    ("align_your_steps", "Align Your Steps", []), ("simple", "Simple", []), ("normal", "Normal", []),
    ("ddim", "DDIM", []), ("beta", "Beta", []),
]  # fmt: skip
# every sampler A1111 offers -> its default schedule (options["scheduler"]), None for none
SAMPLERS = {
    "DPM++ 2M": "karras", "DPM++ SDE": "karras", "DPM++ 2M SDE": "exponential", "DPM++ 2M SDE Heun": "exponential",
    "DPM++ 2S a": "karras", "DPM++ 3M SDE": "exponential", "Euler a": None, "Euler": None, "LMS": None,
    "Heun": None, "DPM2": "karras", "DPM2 a": "karras", "DPM fast": None, "DPM adaptive": None,
    "Restart": "karras", "DDIM": None, "DDIM CFG++": None, "PLMS": None, "UniPC": None, "LCM": None,
}  # fmt: skip


def unquote(text: str) -> str:
    if len(text) == 0 or text[0] != '"' or text[-1] != '"':
        return text
    try:
        return json.loads(text)
    except Exception:
        return text


def parse_generation_parameters(x: str) -> dict:
    res: dict = {}
    prompt = ""
    negative_prompt = ""
    done_with_prompt = False
    *lines, lastline = x.strip().split("\n")
    if len(re_param.findall(lastline)) < 3:
        lines.append(lastline)
        lastline = ""
    for line in lines:
        line = line.strip()
        if line.startswith("Negative prompt:"):
            done_with_prompt = True
            line = line[16:].strip()
        if done_with_prompt:
            negative_prompt += ("" if negative_prompt == "" else "\n") + line
        else:
            prompt += ("" if prompt == "" else "\n") + line
    res["Prompt"] = prompt
    res["Negative prompt"] = negative_prompt
    for k, v in re_param.findall(lastline):
        if v[0] == '"' and v[-1] == '"':
            v = unquote(v)
        m = re_imagesize.match(v)
        if m is not None:
            res[f"{k}-1"] = m.group(1)
            res[f"{k}-2"] = m.group(2)
        else:
            res[k] = v
    res.setdefault("Clip skip", "1")
    res.setdefault("RNG", "GPU")
    res.setdefault("Schedule type", "Automatic")
    return res


def get_sampler_and_scheduler(sampler_name: str | None, scheduler_name: str | None) -> tuple[str, str]:
    """(sampler, schedule label) as A1111's txt2img form gets them from a pasted infotext."""
    labels = {label: (name, label) for name, label, _ in SCHEDULERS}
    found = labels.get(scheduler_name or "", SCHEDULERS[0][:2])
    name = sampler_name or "DPM++ 2M"
    for sched_name, label, aliases in SCHEDULERS:
        for option in (label, sched_name, *aliases):
            if name.endswith(" " + option):
                found, name = (sched_name, label), name[: -len(option) - 1]
                break
    sampler = name if name in SAMPLERS else "DPM++ 2M"
    if SAMPLERS[sampler] == found[0]:  # convert_automatic: the sampler's own default is "Automatic"
        found = ("automatic", "Automatic")
    return sampler, found[1]


def effective_schedule(sampler: str, label: str) -> str:
    """The schedule A1111 runs: "Automatic" is the sampler's default (Karras for DPM++ 2M), else Uniform
    (k-diffusion's own discrete sigmas)."""
    if label != "Automatic":
        return label
    default = SAMPLERS.get(sampler)
    return next((lab for name, lab, _ in SCHEDULERS if name == default), "Uniform")
