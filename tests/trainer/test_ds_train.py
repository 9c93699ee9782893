"""trainer/ds_train.py's small pure parts (its training runs are in test_launch.py)."""
from types import SimpleNamespace

from trainer.ds_train import pad_token_id


def test_padding_takes_pad_else_eos_else_any_id():
    assert pad_token_id(SimpleNamespace(pad_token_id=3, eos_token_id=2)) == 3
    assert pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=2)) == 2
    assert pad_token_id(SimpleNamespace(pad_token_id=0, eos_token_id=2)) == 0  # 0 is an id, not "none"
    # a tokenizer with neither (its template ends a turn with a token of its own): it was None,
    # and torch.full(..., None) failed the job's first batch
    assert pad_token_id(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0
