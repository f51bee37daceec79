"""A1111's prompt language end to end, and the text that goes with it.

Owns: the prompt syntax read into weighted pieces (`syntax`), prompt editing and alternation by step
(`schedule`), weighted long prompts for CLIP encoders (`weights`), what a request's prompts become in
its diffusers calls (`plan`), token windows (`tokens`), styles (`styles`), textual-inversion
embeddings (`embeddings`) and wildcards and variants resolved by Dynamic Prompts (`wildcards`).

May import: schema, sampling, weights (an embedding's hash).
"""
