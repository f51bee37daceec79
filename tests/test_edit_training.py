"""The editor's training schedule: its last phase restarts from the EMA weights, and
`edit-from-export` lets that phase run alone from an exported editor, without phases 1-3."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from models.eval_edit import EDITOR_DIR
from models.train import edit as edit_train
from models.train.train import DEFAULT_STEPS

WEIGHTS = ("unet/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors")


def test_the_schedule_ends_with_a_phase_from_the_ema_weights():
    assert DEFAULT_STEPS["edit"] == edit_train.DEFAULT_STEPS == sum(p.steps for p in edit_train.PHASES)
    last = edit_train.PHASES[-1]
    start = edit_train.DEFAULT_STEPS - last.steps
    assert last.from_ema and not any(p.from_ema for p in edit_train.PHASES[:-1])
    assert edit_train.phase_at(start) == (last, 0)
    assert edit_train.phase_at(start - 1) == (edit_train.PHASES[-2], edit_train.PHASES[-2].steps - 1)


def test_edit_from_export_starts_the_last_phase_from_the_shipped_weights(tmp_path, monkeypatch):
    """Exporting the checkpoint it writes gives the editor it read back bit for bit: the last phase
    starts exactly from that editor's weights. It never overwrites a run's state."""
    monkeypatch.setattr(edit_train, "RUNS", tmp_path / "runs")
    ckpt = torch.load(edit_train.checkpoint_from_export(), weights_only=False)
    assert ckpt["step"] == edit_train.DEFAULT_STEPS - edit_train.PHASES[-1].steps
    out = edit_train.export_edit(tmp_path / "editor")
    for name in WEIGHTS:
        shipped, again = load_file(EDITOR_DIR / name), load_file(out / name)
        assert shipped.keys() == again.keys()
        assert all(torch.equal(shipped[k], again[k]) for k in shipped), name
    with pytest.raises(SystemExit, match="exists"):
        edit_train.checkpoint_from_export()
