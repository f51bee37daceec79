"""Pictures before and after the denoiser: hires fix, inpaint and outpaint, upscalers, grids.

Owns: the hires fix's sizes, enlargement and second pass (`hires`), the mask, fill, crop, paste-back
and outpaint canvas (`inpaint`), upscaler models and tiles (`upscalers`), a script's labelled grid
(`grid`). The request's parts (Hires, Inpaint) are the schema's.

May import: schema, sampling.
"""
