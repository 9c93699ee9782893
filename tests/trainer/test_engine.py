import pytest
from transformers import AutoTokenizer

from tests.trainer.conftest import score_tokens
from trainer.engine import (PROMPT_TOO_LONG, PROMPT_UNRENDERABLE, EngineConfig, PromptError, encode_prompt,
                            encode_prompts, generate, generate_vllm, generate_vllm_each, job_request, prompt_fits,
                            prompt_problems)
from flows.demo.tiny_model import ModelConfig, init_model
from tests.trainer.chat_templates import (GEMMA, GEMMA_TOKENS, LLAMA2, LLAMA3, LLAMA3_TOKENS, MISTRAL, QWEN3,
                                          QWEN25, with_chat_template)
from tests.trainer.conftest import addition_prompt

PROMPTS = [addition_prompt(12, 34), addition_prompt(56, 7), [{"role": "user", "content": "Say hi\n  twice"}]]


def check_samples(samples, cfg, eos_id=4):
    assert [(s.prompt_idx, s.sample_idx) for s in samples] == [(p, k) for p in range(len(PROMPTS))
                                                                for k in range(cfg.n)]
    for s in samples:
        assert len(s.token_ids) == len(s.logprobs) >= 1
        assert all(lp <= 0 for lp in s.logprobs)
        if s.finish_reason == "stop":
            assert s.token_ids[-1] == eos_id and eos_id not in s.token_ids[:-1]
        else:
            assert s.finish_reason == "length" and len(s.token_ids) == cfg.max_tokens


def test_config_validation():
    with pytest.raises(ValueError, match="'vllm' or 'transformers'"):
        EngineConfig(backend="sglang")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        EngineConfig(temperature=0)


def test_transformers_engine_samples_groups_with_logprobs(tiny_model):
    cfg = EngineConfig(backend="transformers", n=4, max_tokens=8, seed=1)
    samples = generate(tiny_model, PROMPTS, cfg)
    check_samples(samples, cfg)
    assert samples[0].prompt_token_ids == samples[3].prompt_token_ids != samples[4].prompt_token_ids
    assert len({tuple(s.token_ids) for s in samples[:4]}) > 1  # a group holds different samples
    again = generate(tiny_model, PROMPTS, cfg)
    assert [s.token_ids for s in again] == [s.token_ids for s in samples]  # seeded


@pytest.mark.slow
def test_vllm_generates_groups_whose_logprobs_match_transformers(tiny_model):
    cfg = EngineConfig(backend="vllm", n=4, max_tokens=8, temperature=0.7, seed=0)
    samples, timing = generate_vllm(tiny_model, PROMPTS, cfg)
    check_samples(samples, cfg)
    assert timing["completion_tokens"] == sum(len(s.token_ids) for s in samples)
    worst = 0.0
    for s in samples:
        ref = score_tokens(tiny_model, s.prompt_token_ids, s.token_ids, temperature=cfg.temperature)
        worst = max(worst, max(abs(a - b) for a, b in zip(ref, s.logprobs)))
    # fp32 on CPU: vLLM's kernels and transformers' agree to rounding
    assert worst < 1e-4, f"vLLM logprobs differ from transformers by {worst}"
    print(f"vllm startup {timing['startup_s']:.1f}s, {timing['tokens_per_s']:.0f} tokens/s, "
          f"max logprob diff {worst:.2e}")


@pytest.mark.slow
def test_vllm_serves_several_models_from_one_process_as_each_would_alone(tiny_model, tmp_path):
    """An evaluation samples candidate and production in one worker: the second engine
    in the process must sample exactly what it would in a process of its own."""
    other = init_model(tmp_path / "other", ModelConfig(seed=3))
    cfg = EngineConfig(backend="vllm", n=3, max_tokens=6, temperature=1.0, seed=5)
    (first, second), timings = generate_vllm_each([(tiny_model, PROMPTS), (other, PROMPTS[:2])], cfg)
    alone, _ = generate_vllm(other, PROMPTS[:2], cfg)
    check_samples(first, cfg)
    assert len(timings) == 2 and len(second) == 2 * cfg.n
    assert [s.token_ids for s in second] == [s.token_ids for s in alone]
    assert [s.token_ids for s in first[:len(second)]] != [s.token_ids for s in second]  # really another model
    worst = max(abs(a - b) for x, y in zip(second, alone) for a, b in zip(x.logprobs, y.logprobs))
    assert worst < 1e-5


USER = [{"role": "user", "content": "What is 2+2?"}]
SYSTEM = [{"role": "system", "content": "Answer with a number."}, *USER]
TWO_USERS = [{"role": "user", "content": "Hi."}, *USER]  # a log whose first request went unanswered


@pytest.mark.parametrize("template, tokens, refused", [
    (GEMMA, GEMMA_TOKENS, [False, True, True]),  # "System role not supported", roles must alternate
    (MISTRAL, (), [False, True, True]),  # v0.1/v0.2: a system turn breaks the alternation too
    (LLAMA2, (), [False, False, True]),  # folds a system turn into <<SYS>> itself
])
def test_prompts_a_chat_template_refuses_are_left_out_not_the_batch(tmp_path, template, tokens, refused):
    model = with_chat_template(init_model(tmp_path / "m"), template, tokens)
    cfg = EngineConfig(backend="transformers", n=2, max_tokens=4)
    prompts = [USER, SYSTEM, TWO_USERS]
    assert prompt_problems(model, prompts, cfg) == [PROMPT_UNRENDERABLE if r else None for r in refused]
    assert prompt_fits(model, prompts, cfg) == [not r for r in refused]
    kept = [p for p, r in zip(prompts, refused) if not r]
    assert len(generate(model, kept, cfg)) == len(kept) * cfg.n  # what is kept samples
    with pytest.raises(PromptError, match="Conversation roles must alternate"):
        encode_prompts(model, [TWO_USERS])


TOOL_TURNS = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
              {"role": "user", "content": "So, shorts?"}]


@pytest.mark.parametrize("template, tokens, problem", [
    (LLAMA3, LLAMA3_TOKENS, PROMPT_UNRENDERABLE),  # 3.0 renders the call's turn as "None", no call
    (None, (), PROMPT_UNRENDERABLE),  # the tiny model's ChatML: str + None raises TypeError
    (QWEN25, (), None),  # renders the call and the tool's answer
])
def test_tool_calls_a_template_does_not_render_leave_the_prompt_out(tmp_path, template, tokens, problem):
    model = init_model(tmp_path / "m")
    if template:
        with_chat_template(model, template, tokens)
    cfg = EngineConfig(backend="transformers", max_tokens=4)
    assert prompt_problems(model, [USER, TOOL_TURNS], cfg) == [None, problem]
    if problem is None:
        text = AutoTokenizer.from_pretrained(str(model)).decode(encode_prompts(model, [TOOL_TURNS])[0])
        assert "get_weather" in text and "sunny, 21C" in text


NO_THINKING = {"enable_thinking": False}


def test_a_prompt_is_rendered_with_its_chat_template_arguments_everywhere_it_is_encoded(tmp_path):
    """Qwen3's `enable_thinking: false` writes an empty think block after the assistant's
    opening: a prompt production sent with it is sampled, sized and handed to vLLM as
    exactly that text, not as the template's default (thinking on)."""
    model = with_chat_template(init_model(tmp_path / "m"), QWEN3)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    default, no_thinking = encode_prompt(tokenizer, USER), encode_prompt(tokenizer, USER, NO_THINKING)
    assert no_thinking == default + tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert encode_prompts(model, [USER, USER], [None, NO_THINKING]) == [default, no_thinking]
    # the default fits its budget exactly; the same messages with the think block do not
    cfg = EngineConfig(backend="transformers", n=2, max_tokens=4, max_model_len=len(default) + 4)
    assert prompt_problems(model, [USER, USER], cfg, template_args=[None, NO_THINKING]) == [None, PROMPT_TOO_LONG]
    samples = generate(model, [USER], EngineConfig(backend="transformers", n=2, max_tokens=3),
                       template_args=[NO_THINKING])
    assert [s.prompt_token_ids for s in samples] == [no_thinking, no_thinking]
    job = job_request([(model, [USER, USER])], cfg, template_args=[[NO_THINKING, None]])
    assert job["runs"][0]["prompt_token_ids"] == [no_thinking, default]  # the ids the vLLM worker samples from
