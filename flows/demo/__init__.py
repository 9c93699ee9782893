"""Everything the demo needs and nothing else does: the data generator (`data/`), the
simulated production traffic (`simulate`), the tiny character-level model and its
tokenizer (`tiny_model`, `tokenizer`), its SFT warm-up (`sft`), the demo flow (`flow`)
and its commands (`command`, `data_command`, `model_command`). No stage package or
trainer module imports from here."""
