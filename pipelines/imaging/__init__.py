"""Pictures before and after the denoiser: hires fix, inpaint and outpaint, the detailer, upscalers, grids.

Owns: the hires fix's sizes, enlargement and second pass (`hires`), the mask, fill, crop, paste-back
and outpaint canvas (`inpaint`), upscaler models and tiles (`upscalers`), a script's labelled grid
(`grid`), the detailer's detectors and its pass over each region (`detailer`). The request's parts
(Hires, Inpaint, Detailer) are the schema's.

May import: schema, sampling, and devices (a detector loads under ONE_LOAD).
"""
