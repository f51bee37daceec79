"""PNG metadata, written and read: A1111's infotext and our JSON out, every tool's parameters back in.

Owns: what a result's PNG carries (`write`), reading parameters back from our images and A1111's
(`read`), ComfyUI's graphs (`comfy`), SwarmUI, Fooocus, InvokeAI, NovelAI and Stability Matrix
(`tools`), and the text of any picture file (`files`).

May import: schema, sampling, control, imaging (their infotext lines).
"""
