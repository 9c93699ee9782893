"""Model folders as users bring them, made from the tiny model for tests."""
from __future__ import annotations

import json
from pathlib import Path

PLAIN_TEXT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}assistant: {% endif %}")


def without_stop_token(folder: Path) -> Path:
    """`folder` with no eos_token and a chat template that ends an assistant's turn with
    plain text: nothing would stop a completion."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["eos_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").unlink()
    (folder / "chat_template.jinja").write_text(PLAIN_TEXT_TEMPLATE)
    return folder
