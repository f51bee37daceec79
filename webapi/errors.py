"""A refusal named as an HTTP API's client sent it.

Request fields are refused by the schema as `pipelines.schema.request.RequestError`, named by our field
(each API maps that name to its own: A1111's `loc`, OpenAI's `param`). What only one API has (its
body's shape, A1111's `n_iter`, OpenAI's `size` and `response_format`, an upload's bytes) is refused
as a `WireError` that already carries that API's name for it.
"""

from __future__ import annotations


class WireError(ValueError):
    """A refused value of this API's own: `loc` its place in the body (("init_images", 1), ("size",)),
    `detail` the sentence. `str()` is "init_images[1]: not valid base64"."""

    def __init__(self, loc: tuple[str | int, ...], detail: str):
        self.loc = tuple(loc)
        self.detail = detail
        where = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(self.loc))
        super().__init__(f"{where}: {detail}" if where else detail)
