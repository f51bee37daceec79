"""Steering by pictures: ControlNet units, their preprocessors, annotator models and IP-Adapters.

Owns: the ControlNet models and the twins that run them (`controlnet`), the built-in preprocessors'
code (`maps`; their names are the schema's), the model-based ones (`annotators`, drawn with
`openpose` and `ade20k`), IP-Adapter image prompts (`ip_adapter`).

May import: the schema only (ControlUnit, ImagePrompt and the preprocessor names live there).
"""
