"""The policy's logprob of each completion token, without the whole step's logits.

A causal LM's head turns every position's hidden state into a vocabulary-sized row of
logits. Training needs the logprob of one token per position, and only at completion
positions; materialising the float32 log-softmax of every position of a piece costs
tokens x vocab x 4 bytes several times over (a piece of 8192 tokens of a 49k vocab held
about 8 GB), and the head's product over prompt and padding positions is wasted work.

So for the plain-head architectures of LINEAR_HEAD_MODELS the model is called for its
last hidden state (and the logits of one position: `logits_to_keep=1`), still through
the DeepSpeed engine's forward, and `LinearLogprob` applies the head to the completion
positions only, in chunks of at most CHUNK_ELEMENTS logits, recomputing each chunk's
logits in backward instead of keeping them (the "fused linear cross-entropy" of
Liger-Kernel and others). Other architectures, and ZeRO-3 (whose parameters are
gathered only inside their module's forward), take the plain path: the full model's
logits, then log-softmax.
Not here: the loss (trainer.loss), batching (trainer.rollout_data).
"""

from __future__ import annotations

import torch

# Architectures whose causal-LM forward is exactly `lm_head(decoder(...))`: no logit
# scaling or soft-capping (Gemma 2, Cohere and others have one, so they take the plain path).
LINEAR_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Logits alive at once in the chunked head: 2^27 float32 = 512 MB, about 880 positions of
# Qwen2's 152k vocabulary or 2,700 of SmolLM2's 49k.
CHUNK_ELEMENTS = 1 << 27


def token_logprobs(model, batch: dict[str, torch.Tensor], temperature: float,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each next token ([n, L-1], zero outside batch["mask"]) and, optionally,
    the policy's entropy there (no gradient).

    The model gets no attention mask: rows are right-padded, so under causal attention
    no real token attends to a pad, and positions count from 0 either way. With a mask,
    attention kernels take it as an explicit bias (no flash attention on a GPU)."""
    head = linear_head(model)
    if head is None:
        return full_logit_logprobs(model, batch, temperature, with_entropy)
    # the last of the hidden states is the final norm's output, the head's input
    hidden = model(input_ids=batch["input_ids"], output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
    mask = batch["mask"]
    targets = batch["input_ids"][:, 1:][mask]
    logp_sel, entropy_sel = LinearLogprob.apply(hidden[:, :-1][mask], head.weight, targets, 1.0 / temperature,
                                                with_entropy)
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(mask, logp_sel)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(mask.shape, dtype=torch.float32, device=hidden.device).masked_scatter(
            mask, entropy_sel)
    return logp, entropy


def linear_head(model):
    """The output head when the model's logits are `head(last hidden state)` and its
    weight is whole on this rank; None otherwise. `model`: a Hugging Face causal LM, a
    PEFT model of one, or a DeepSpeed engine of either."""
    if hasattr(model, "module"):  # a DeepSpeed engine
        model = model.module
    if hasattr(model, "get_base_model"):  # a PEFT model: LoRA lives inside the decoder's layers
        model = model.get_base_model()
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in LINEAR_HEAD_MODELS:
        return None
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None or hasattr(head.weight, "ds_id"):
        return None  # ds_id: a ZeRO-3 partitioned parameter
    return head


def full_logit_logprobs(model, batch: dict[str, torch.Tensor], temperature: float,
                        with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain path: every position's logits from the full model, then log-softmax."""
    logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
    if temperature != 1.0:
        logits = logits.float() / temperature
    # in float32 (bf16 logits on GPU), without a separate float32 copy of the logits
    logp_all = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    logp = logp_all.gather(2, batch["input_ids"][:, 1:, None]).squeeze(2) * batch["mask"]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(dim=-1) * batch["mask"]
    return logp, entropy


class LinearLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] for rows h, in chunks; backward recomputes each chunk.

    The gradient of logp = z[y] - logsumexp(z) with respect to z = h W^T / T is
    (onehot(y) - softmax(z)) / T per unit of upstream gradient; from it, dh = dz W and
    dW = dz^T h, accumulated over chunks in float32.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, inv_temp: float,
                with_entropy: bool):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in chunks(n, weight.shape[0]):
            z = chunk_logits(hidden[s], weight, inv_temp)
            lse[s] = torch.logsumexp(z, dim=-1)
            logp[s] = z.gather(1, targets[s, None]).squeeze(1) - lse[s]
            if with_entropy:
                entropy[s] = lse[s] - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.inv_temp = inv_temp
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for s in chunks(hidden.shape[0], weight.shape[0]):
            # in place: each pass over a chunk's logits is a pass over chunk x vocab floats
            g = grad_logp[s, None]
            dz = chunk_logits(hidden[s], weight, ctx.inv_temp).sub_(lse[s, None]).exp_().mul_(-g)  # -softmax x g
            dz.scatter_add_(1, targets[s, None], g)
            if ctx.inv_temp != 1.0:
                dz.mul_(ctx.inv_temp)
            dz = dz.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[s] = dz @ weight
            if grad_weight is not None:
                grad_weight += (dz.T @ hidden[s]).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, inv_temp: float) -> torch.Tensor:
    z = (hidden @ weight.T).float()  # a no-op on CPU, where the trainer runs in float32
    return z.mul_(inv_temp) if inv_temp != 1.0 else z


def chunks(n: int, vocab: int) -> list[slice]:
    """Slices of range(n) with at most CHUNK_ELEMENTS logits each."""
    size = max(1, CHUNK_ELEMENTS // vocab)
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]
