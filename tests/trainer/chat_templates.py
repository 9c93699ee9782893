"""Chat templates of real model families, shortened, and a tiny model folder that uses one.

Each keeps what decides how a family renders a task's messages: Gemma (1, 2) refuses a
system turn, Mistral v0.1/v0.2 and Llama 2 insist on alternating user/assistant turns,
Llama 3 writes its own BOS and knows no tool calls (3.0), Qwen 2.5 adds a default system
prompt and renders tool calls, Qwen 3 has the `enable_thinking` switch.
"""
from __future__ import annotations

from pathlib import Path

_ALTERNATE = ("{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}")

GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}" + _ALTERNATE +
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
GEMMA_TOKENS = ("<start_of_turn>", "<end_of_turn>")

MISTRAL = ("{{ bos_token }}{% for message in messages %}" + _ALTERNATE +
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
          "{% set system_message = false %}{% endif %}{% for message in loop_messages %}" + _ALTERNATE +
          "{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
          "{% endfor %}")

LLAMA3 = ("{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
          "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
LLAMA3_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

_QWEN_TURNS = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n' }}{%- endif %}{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}")
QWEN25 = _QWEN_TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
QWEN3 = (_QWEN_TURNS + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
         "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
         "{%- endif %}{%- endif %}")

# ChatML whose `add_generation_prompt` branch is missing: a prompt ends after the user's turn.
NO_GENERATION_PROMPT = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
                        "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}")


def with_chat_template(folder: Path, template: str, tokens: tuple[str, ...] = (), bos: str | None = None) -> Path:
    """The tiny model `folder` speaking `template`: its special `tokens` added (the embeddings
    grown to match, so the model can still be sampled) and `bos` as its BOS token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
        model = AutoModelForCausalLM.from_pretrained(str(folder))
        model.resize_token_embeddings(len(tokenizer))
        model.save_pretrained(str(folder))
    if bos:
        tokenizer.bos_token = bos
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(folder))
    return folder
