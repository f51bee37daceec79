"""Running a model: `ImagePipeline` and the pieces it composes, the top room of the pipeline layer.

Owns: `ImagePipeline` (`image_pipeline`: the request's walk, numbered as diffusers' pipelines number
theirs) and what it is made of: the refusals before any work (`checks`), the task's pipeline twins
(`twins`), one request's plan (`planning`), the diffusers calls in micro-batches (`denoise`), regional prompts' plan (`regions`), the result
and its metadata (`results`), set-up (`model_setup`), what a family can do (`traits`) and the arguments
it takes (`calls`), the step callbacks (`callbacks`), the layer's settings (`options`) and the contract
every backend keeps (`backend`).

May import: every room below it (sampling, control, imaging, weights, prompts, schema) and devices.
"""
