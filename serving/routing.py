"""Two backends as one: the main one and a model beside it (the editor, the video model), each request to one.

`Beside` is what `serving.editing.EditRouter` and `serving.video.VideoRouter` share: the abilities both declare
(previews where both stream them; switching and token counting are the main model's), the main backend's
concurrency, a request to the backend `_for` picks, and closing both. A subclass says where a request goes, how
`ModelInfo` describes the pair, and what a model switch does.
"""

from __future__ import annotations

from typing import Any

from pipelines import CancelFn, Capabilities, GenerationBackend, PreviewFn, ProgressFn
from pipelines.schema.request import GenerationRequest, GenerationResult


class Beside:
    """The main backend and one beside it; `_for(request)` picks the one that runs a request."""

    def __init__(self, main: GenerationBackend, beside: GenerationBackend):
        self.main = main
        self.beside = beside

    def _for(self, request: GenerationRequest) -> GenerationBackend:
        raise NotImplementedError

    @property
    def capabilities(self) -> Capabilities:
        """Previews where both backends stream them; switching and token counting are the main model's."""
        main, beside = self.main.capabilities, self.beside.capabilities
        return Capabilities(previews=main.previews and beside.previews, switch_models=main.switch_models,
                            count_tokens=main.count_tokens)  # fmt: skip

    @property
    def concurrency(self) -> int:
        return self.main.concurrency

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
    ) -> GenerationResult:
        return self._for(request).generate(request, progress, should_cancel, preview)

    def count_tokens(self, prompt: str) -> Any:
        """The main model's token counter (declared in `capabilities` when the main backend has one)."""
        return self.main.count_tokens(prompt)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.main.close()
        self.beside.close()
