"""The request schema, torch-free, at the bottom of the pipeline layer: what a request is, written once.

Owns: the value types and what a field is (`fields`), the request and its result (`request`), the
request's nested parts with their constants and choice lists (`hires`, `inpaint`, `control`: a
ControlNet unit and the preprocessor names, `image_prompt`, `regions`: regional prompts and their
layout, `detailer`: ADetailer's two passes), the layer's errors (`errors`), the
command-line flags derived from the schema (`cli`) and docs/request-fields.md (`docs`).

May import: pydantic, PIL and the standard library; nothing of the project's above it, no torch,
diffusers or devices (import-linter: `import pipelines.schema` loads no runtime, tests/test_structure.py
checks `sys.modules`). A thin front end can read, validate and document a request with this alone.
"""
